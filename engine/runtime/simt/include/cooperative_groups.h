// cuda-sim stand-in for the CUDA header: the prelude defines cooperative_groups::this_grid().sync().
#pragma once
#include "tw_simt.h"
