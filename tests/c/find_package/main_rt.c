/* main_rt.c -- the smallest deployment program: uses the installed
 * driver-only runtime (sparseforge::sparseforge_rt) alone, prints its
 * version and the grid of a launch record for N = 4096, and checks the
 * version matches the header. */
#include <stdio.h>
#include <string.h>

#include <sparseforge_runtime.h>

int main(void) {
  const char *v = sf_version();
  if (strcmp(v, SF_VERSION_STRING) != 0) {
    fprintf(stderr, "library %s does not match header %s\n", v,
            SF_VERSION_STRING);
    return 1;
  }
  sf_launch_record rec = {{96, 1, 1}, 1, 16, {128, 1, 1}, 4096, 0};
  sf_launch_config cfg;
  sf_status st = sf_launch_config_for(NULL, &rec, 4096, NULL, &cfg);
  if (st != SF_OK) {
    fprintf(stderr, "sf_launch_config_for: %s\n", sf_errstr(st));
    return 1;
  }
  printf("sparseforge_rt %s grid %u x %u x %u\n", v, cfg.grid[0], cfg.grid[1],
         cfg.grid[2]);
  return 0;
}
