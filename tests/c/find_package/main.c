/* main.c -- the smallest program that uses the installed library: prints
 * the version it links against and checks it matches the header. */
#include <stdio.h>
#include <string.h>

#include <sparseforge.h>

int main(void) {
  const char *v = sf_version();
  printf("sparseforge %s\n", v);
  if (strcmp(v, SF_VERSION_STRING) != 0) {
    fprintf(stderr, "library %s does not match header %s\n", v,
            SF_VERSION_STRING);
    return 1;
  }
  return 0;
}
