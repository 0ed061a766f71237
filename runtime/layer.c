/* layer.c -- (being written) */
