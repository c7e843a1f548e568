/* load.c: the loader (ckptfs_loader_*, ckptfs_load). */
#include "trainer/ckptfs.h"
