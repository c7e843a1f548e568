/* api.c: library-wide entry points of libckptfs (version, capabilities). */
#include "trainer/ckptfs.h"

__attribute__((visibility("default"))) int ckptfs_api_version(void)
{
	return CKPTFS_API_VERSION;
}
