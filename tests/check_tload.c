/* check_tload.c: placeholder until the suite lands. */
#include <check.h>
#include <stdlib.h>
#include "trainer/ckptfs.h"
START_TEST(test_version) { ck_assert_int_eq(ckptfs_api_version(), CKPTFS_API_VERSION); }
END_TEST
int main(void)
{
	Suite *s = suite_create("tload");
	TCase *tc = tcase_create("api");
	tcase_add_test(tc, test_version);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int nf = srunner_ntests_failed(sr);
	srunner_free(sr);
	return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
