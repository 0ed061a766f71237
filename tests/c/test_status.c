/* test_status.c -- status and activation names, versions and SHA-256. */
#include "check.h"
#include "sparseforge.h"

int main(void) {
  CHECK(strcmp(sf_version(), SF_VERSION_STRING) == 0);
  CHECK(strcmp(sf_errstr(SF_ERR_NO_DRIVER), "no CUDA driver found") == 0);
  CHECK(strcmp(sf_status_name(SF_ERR_CORRUPT), "SF_ERR_CORRUPT") == 0);
  CHECK(strcmp(sf_errstr(12345), "unknown status") == 0);
  CHECK(strcmp(sf_status_name(-1), "SF_UNKNOWN") == 0);
  CHECK_EQ_INT(17, SF_ERR_FAULT);
  CHECK(strcmp(sf_status_name(SF_ERR_FAULT), "SF_ERR_FAULT") == 0);
  CHECK(strcmp(sf_errstr(SF_ERR_FAULT), "a kernel faulted: the context is unusable") == 0);
  CHECK(strcmp(sf_status_name(18), "SF_UNKNOWN") == 0);
  /* activations: the table's codes and words */
  CHECK_EQ_INT(0, SF_ACT_NONE);
  CHECK_EQ_INT(1, SF_ACT_RELU);
  CHECK_EQ_INT(2, SF_ACT_GELU);
  CHECK(strcmp(sf_activation_name(SF_ACT_NONE), "none") == 0);
  CHECK(strcmp(sf_activation_name(SF_ACT_RELU), "relu") == 0);
  CHECK(strcmp(sf_activation_name(SF_ACT_GELU), "gelu") == 0);
  CHECK(sf_activation_name(3) == NULL);
  CHECK(sf_activation_name(-1) == NULL);
  char hex[65];
  CHECK_EQ_INT(SF_OK, sf_sha256_hex("abc", 3, hex));
  CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
  CHECK_EQ_INT(SF_OK, sf_sha256_hex(NULL, 0, hex));
  CHECK(strcmp(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") == 0);
  /* 1,000,000 'a' crosses many blocks */
  static char big[1000000];
  memset(big, 'a', sizeof big);
  CHECK_EQ_INT(SF_OK, sf_sha256_hex(big, sizeof big, hex));
  CHECK(strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0") == 0);
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_sha256_hex(NULL, 3, hex));
  CHECK_EQ_INT(SF_ERR_INVALID_ARG, sf_sha256_hex("abc", 3, NULL));
  CHECK_DONE();
}
