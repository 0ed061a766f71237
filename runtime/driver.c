/* driver.c -- (being written) */
