// cuda-sim stand-in for the CUDA header: the prelude defines __half and its conversions.
#pragma once
#include "tw_simt.h"
