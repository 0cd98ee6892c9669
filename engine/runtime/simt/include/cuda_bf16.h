// cuda-sim stand-in for the CUDA header: the prelude defines __nv_bfloat16 and its conversions.
#pragma once
#include "tw_simt.h"
