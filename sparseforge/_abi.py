"""The C library's binary interface: GENERATED from runtime/sparseforge_runtime.h
and runtime/sparseforge.h by generator/tools/abi.py; edit the headers and run
`python -m sparseforge.generator.tools.abi`, not this file."""
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_int, c_int32,
                    c_int64, c_size_t, c_ubyte, c_uint, c_uint64, c_void_p)

# SF_STATUS_TABLE: (name, value, description)
STATUS = (
    ('SF_OK', 0, 'success'),
    ('SF_ERR_INVALID_ARG', 1, 'invalid argument'),
    ('SF_ERR_NOMEM', 2, 'out of host memory'),
    ('SF_ERR_IO', 3, 'input/output error'),
    ('SF_ERR_NO_DRIVER', 4, 'no CUDA driver found'),
    ('SF_ERR_NO_DEVICE', 5, 'no CUDA device'),
    ('SF_ERR_CUDA', 6, 'CUDA driver error'),
    ('SF_ERR_COMPILE', 7, 'compilation failed'),
    ('SF_ERR_NVRTC', 8, 'NVRTC error'),
    ('SF_ERR_NOT_FOUND', 9, 'not found'),
    ('SF_ERR_DB', 10, 'database error'),
    ('SF_ERR_NOT_A_DB', 11, 'file is not a sparseforge database'),
    ('SF_ERR_DB_VERSION', 12, 'database is from a newer sparseforge'),
    ('SF_ERR_CORRUPT', 13, 'stored data failed its checksum'),
    ('SF_ERR_LAUNCH', 14, 'kernel launch failed'),
    ('SF_ERR_NO_BINARY', 15, 'no binary for this GPU and no way to compile one'),
    ('SF_ERR_BUSY', 16, 'database is busy'),
    ('SF_ERR_FAULT', 17, 'a kernel faulted: the context is unusable'),
)

# SF_ACTIVATION_TABLE: (name, value, word)
ACTIVATIONS = (
    ('SF_ACT_NONE', 0, 'none'),
    ('SF_ACT_RELU', 1, 'relu'),
    ('SF_ACT_GELU', 2, 'gelu'),
)

# SF_LAUNCH_RECORD_FIELDS: (name, C type, count (0: one value), description)
LAUNCH_RECORD_FIELDS = (
    ('grid', 'unsigned', 3, 'the grid for N <= n_tile'),
    ('n_axis', 'int', 0, 'grid axis multiplied by ceil(N / n_tile); -1: none'),
    ('n_tile', 'int', 0, 'columns of N one step along n_axis covers'),
    ('block', 'unsigned', 3, 'threads per block'),
    ('shared_bytes', 'unsigned', 0, 'dynamic shared memory per block, bytes'),
    ('zero_output', 'int', 0, 'nonzero: Y is zeroed before each launch (split-K)'),
)

# every enum value and numeric #define
CONSTANTS = {
    'SF_VERSION_MAJOR': 0,
    'SF_VERSION_MINOR': 1,
    'SF_VERSION_PATCH': 0,
    'SF_CACHE_SCHEMA_VERSION': 1,
    'SF_CACHE_APPLICATION_ID': 1397124978,
    'SF_OK': 0,
    'SF_ERR_INVALID_ARG': 1,
    'SF_ERR_NOMEM': 2,
    'SF_ERR_IO': 3,
    'SF_ERR_NO_DRIVER': 4,
    'SF_ERR_NO_DEVICE': 5,
    'SF_ERR_CUDA': 6,
    'SF_ERR_COMPILE': 7,
    'SF_ERR_NVRTC': 8,
    'SF_ERR_NOT_FOUND': 9,
    'SF_ERR_DB': 10,
    'SF_ERR_NOT_A_DB': 11,
    'SF_ERR_DB_VERSION': 12,
    'SF_ERR_CORRUPT': 13,
    'SF_ERR_LAUNCH': 14,
    'SF_ERR_NO_BINARY': 15,
    'SF_ERR_BUSY': 16,
    'SF_ERR_FAULT': 17,
    'SF_ACT_NONE': 0,
    'SF_ACT_RELU': 1,
    'SF_ACT_GELU': 2,
    'SF_BINARY_CUBIN': 0,
    'SF_BINARY_PTX': 1,
    'SF_DTYPE_FP32': 0,
    'SF_DTYPE_FP16': 1,
    'SF_DTYPE_BF16': 2,
    'SF_CACHE_READONLY': 1,
    'SF_CACHE_CREATE': 2,
    'SF_TRIAL_OK': 0,
    'SF_TRIAL_COMPILE_FAIL': 1,
    'SF_TRIAL_LAUNCH_FAIL': 2,
    'SF_TRIAL_WRONG': 3,
    'SF_TRIAL_TIMEOUT': 4,
}


class sf_device_info(Structure):
    _fields_ = [
        ('name', c_char * 256),
        ('cc_major', c_int),
        ('cc_minor', c_int),
        ('arch', c_char * 16),
        ('sm_count', c_int),
        ('l2_bytes', c_int),
        ('smem_per_block_optin', c_int),
        ('smem_per_sm', c_int),
        ('regs_per_block', c_int),
        ('max_threads_per_block', c_int),
        ('clock_khz', c_int),
        ('driver_version', c_int),
        ('total_mem_bytes', c_uint64),
    ]


class sf_kernel_attrs(Structure):
    _fields_ = [
        ('num_regs', c_int),
        ('shared_bytes', c_int),
        ('local_bytes', c_int),
        ('max_threads', c_int),
    ]


class sf_launch_config(Structure):
    _fields_ = [
        ('grid', c_uint * 3),
        ('block', c_uint * 3),
        ('shared_bytes', c_uint),
        ('stream', c_void_p),
    ]


class sf_kernel_args(Structure):
    _fields_ = [
        ('ptrs', c_void_p * 6),
        ('packed', c_uint64),
        ('x', c_uint64),
        ('y', c_uint64),
        ('n', c_int),
        ('n_args', c_int),
        ('x_map', c_ubyte * 128),
        ('y_map', c_ubyte * 128),
    ]


class sf_timing_options(Structure):
    _fields_ = [
        ('warmup', c_int),
        ('min_reps', c_int),
        ('max_reps', c_int),
        ('min_total_ms', c_double),
        ('flush_l2', c_int),
        ('graph_batch', c_int),
        ('rotate_bytes', c_uint64),
    ]


class sf_timing(Structure):
    _fields_ = [
        ('median_ms', c_double),
        ('p20_ms', c_double),
        ('p80_ms', c_double),
        ('min_ms', c_double),
        ('mean_ms', c_double),
        ('reps', c_int),
    ]


class sf_launch_record(Structure):
    _fields_ = [
        ('grid', c_uint * 3),
        ('n_axis', c_int),
        ('n_tile', c_int),
        ('block', c_uint * 3),
        ('shared_bytes', c_uint),
        ('zero_output', c_int),
    ]


class sf_layer_code(Structure):
    _fields_ = [
        ('n_bucket', c_int64),
        ('kernel_name', c_char_p),
        ('launch', sf_launch_record),
        ('binary', c_void_p),
        ('binary_size', c_size_t),
        ('binary_kind', c_int),
        ('packed', c_void_p),
        ('packed_size', c_size_t),
    ]


class sf_layer_desc(Structure):
    _fields_ = [
        ('name', c_char_p),
        ('rows', c_int64),
        ('cols', c_int64),
        ('x_elem_size', c_int),
        ('y_elem_size', c_int),
        ('n_variants', c_int),
        ('variants', POINTER(sf_layer_code)),
    ]


class sf_compile_options(Structure):
    _fields_ = [
        ('arch', c_char_p),
        ('kind', c_int),
        ('include_dirs', POINTER(c_char_p)),
        ('extra_options', POINTER(c_char_p)),
        ('cuda_include_dir', c_char_p),
    ]


class sf_gemm_desc(Structure):
    _fields_ = [
        ('dtype', c_int),
        ('m', c_int64),
        ('n', c_int64),
        ('k', c_int64),
        ('layout', c_int),
    ]


class sf_gemm_timing(Structure):
    _fields_ = [
        ('timing', sf_timing),
        ('layout_used', c_int),
    ]


class sf_blocked_ell_desc(Structure):
    _fields_ = [
        ('dtype', c_int),
        ('m', c_int64),
        ('n', c_int64),
        ('k', c_int64),
        ('block', c_int64),
        ('ell_cols', c_int64),
        ('col_ind', POINTER(c_int32)),
        ('layout', c_int),
    ]


class sf_csr_desc(Structure):
    _fields_ = [
        ('dtype', c_int),
        ('m', c_int64),
        ('n', c_int64),
        ('k', c_int64),
        ('nnz', c_int64),
        ('row_ptr', POINTER(c_int32)),
        ('col_ind', POINTER(c_int32)),
        ('layout', c_int),
        ('alg', c_int),
    ]


class sf_csr_timing(Structure):
    _fields_ = [
        ('timing', sf_timing),
        ('alg_used', c_int),
    ]


class sf_sparselt_desc(Structure):
    _fields_ = [
        ('dtype', c_int),
        ('m', c_int64),
        ('n', c_int64),
        ('k', c_int64),
        ('layout', c_int),
    ]


class sf_sparselt_timing(Structure):
    _fields_ = [
        ('timing', sf_timing),
        ('alg_id', c_int),
    ]


class sf_binary_key(Structure):
    _fields_ = [
        ('source', c_char_p),
        ('options', c_char_p),
        ('arch', c_char_p),
        ('nvrtc_version', c_char_p),
        ('generator_version', c_char_p),
        ('kind', c_int),
    ]


class sf_matrix_record(Structure):
    _fields_ = [
        ('fingerprint', c_char_p),
        ('rows', c_int64),
        ('cols', c_int64),
        ('nnz', c_int64),
        ('dtype', c_char_p),
        ('info', c_char_p),
    ]


class sf_trial(Structure):
    _fields_ = [
        ('env_key', c_char_p),
        ('matrix_fp', c_char_p),
        ('op', c_char_p),
        ('n', c_int64),
        ('config', c_char_p),
        ('status', c_int),
        ('median_ms', c_double),
        ('p20_ms', c_double),
        ('p80_ms', c_double),
        ('min_ms', c_double),
        ('reps', c_int),
        ('max_error', c_double),
        ('binary_key', c_char_p),
        ('message', c_char_p),
        ('created', c_double),
    ]


class sf_trial_filter(Structure):
    _fields_ = [
        ('env_key', c_char_p),
        ('matrix_fp', c_char_p),
        ('op', c_char_p),
        ('n', c_int64),
    ]


class sf_layer_variant(Structure):
    _fields_ = [
        ('n_bucket', c_int64),
        ('source', c_char_p),
        ('kernel_name', c_char_p),
        ('options', c_char_p),
        ('generator_version', c_char_p),
        ('launch', sf_launch_record),
        ('packed', c_void_p),
        ('packed_size', c_size_t),
        ('config', c_char_p),
    ]


class sf_layer_record(Structure):
    _fields_ = [
        ('name', c_char_p),
        ('gpu_name', c_char_p),
        ('matrix_fp', c_char_p),
        ('op', c_char_p),
        ('rows', c_int64),
        ('cols', c_int64),
        ('x_elem_size', c_int),
        ('y_elem_size', c_int),
        ('n_variants', c_int),
        ('variants', POINTER(sf_layer_variant)),
        ('problem', c_char_p),
    ]


class sf_cache_counts(Structure):
    _fields_ = [
        ('binaries', c_int64),
        ('envs', c_int64),
        ('matrices', c_int64),
        ('trials', c_int64),
        ('winners', c_int64),
        ('layers', c_int64),
        ('layer_variants', c_int64),
        ('blobs', c_int64),
        ('blob_bytes', c_int64),
    ]


sf_env_cb = CFUNCTYPE(c_int, c_char_p, POINTER(sf_device_info), c_void_p)
sf_matrix_cb = CFUNCTYPE(c_int, POINTER(sf_matrix_record), c_void_p)
sf_trial_cb = CFUNCTYPE(c_int, POINTER(sf_trial), c_void_p)
sf_layer_cb = CFUNCTYPE(c_int, POINTER(sf_layer_record), c_void_p)
sf_skip_cb = CFUNCTYPE(None, c_char_p, c_void_p)

# name -> (restype, argtypes)
PROTOTYPES = {
    'sf_version': (c_char_p, []),
    'sf_errstr': (c_char_p, [c_int]),
    'sf_status_name': (c_char_p, [c_int]),
    'sf_free_buffer': (None, [c_void_p]),
    'sf_sha256_hex': (c_int, [c_void_p, c_size_t, c_char * 65]),
    'sf_activation_name': (c_char_p, [c_int]),
    'sf_context_create': (c_int, [c_int, POINTER(c_void_p)]),
    'sf_context_destroy': (None, [c_void_p]),
    'sf_errmsg': (c_char_p, [c_void_p]),
    'sf_errcode': (c_int, [c_void_p]),
    'sf_context_fail': (c_int, [c_void_p, c_int, c_char_p]),
    'sf_device_info_get': (c_int, [c_void_p, POINTER(sf_device_info)]),
    'sf_device_count': (c_int, [c_void_p, POINTER(c_int)]),
    'sf_binary_from_memory': (c_int, [c_void_p, c_size_t, c_int, POINTER(c_void_p)]),
    'sf_binary_data': (c_void_p, [c_void_p, POINTER(c_size_t)]),
    'sf_binary_get_kind': (c_int, [c_void_p]),
    'sf_binary_log': (c_char_p, [c_void_p]),
    'sf_binary_free': (None, [c_void_p]),
    'sf_module_load': (c_int, [c_void_p, c_void_p, POINTER(c_void_p)]),
    'sf_module_unload': (None, [c_void_p]),
    'sf_kernel_get': (c_int, [c_void_p, c_void_p, c_char_p, POINTER(c_void_p)]),
    'sf_kernel_attributes': (c_int, [c_void_p, c_void_p, POINTER(sf_kernel_attrs)]),
    'sf_kernel_args_set': (c_int, [c_void_p, c_void_p, c_uint64, c_uint64, c_uint64, c_int64, POINTER(sf_kernel_args)]),
    'sf_launch': (c_int, [c_void_p, c_void_p, POINTER(sf_launch_config), POINTER(c_void_p)]),
    'sf_synchronize': (c_int, [c_void_p]),
    'sf_time_kernel': (c_int, [c_void_p, c_void_p, POINTER(sf_launch_config), POINTER(c_void_p), POINTER(sf_timing_options), POINTER(sf_timing)]),
    'sf_time_kernel_sets': (c_int, [c_void_p, c_void_p, POINTER(sf_launch_config), POINTER(c_void_p), c_int, POINTER(sf_timing_options), POINTER(sf_timing)]),
    'sf_launch_record_problem': (c_char_p, [POINTER(sf_launch_record)]),
    'sf_launch_config_for': (c_int, [c_void_p, POINTER(sf_launch_record), c_int64, c_void_p, POINTER(sf_launch_config)]),
    'sf_mem_alloc': (c_int, [c_void_p, c_size_t, POINTER(c_uint64)]),
    'sf_mem_free': (c_int, [c_void_p, c_uint64]),
    'sf_memcpy_htod': (c_int, [c_void_p, c_uint64, c_void_p, c_size_t]),
    'sf_memcpy_dtoh': (c_int, [c_void_p, c_void_p, c_uint64, c_size_t]),
    'sf_memset_d8': (c_int, [c_void_p, c_uint64, c_ubyte, c_size_t]),
    'sf_layer_load': (c_int, [c_void_p, POINTER(sf_layer_desc), POINTER(c_void_p)]),
    'sf_layer_close': (None, [c_void_p]),
    'sf_layer_run': (c_int, [c_void_p, c_void_p, c_uint64, c_uint64, c_int64, c_void_p]),
    'sf_layer_run_packed': (c_int, [c_void_p, c_void_p, POINTER(c_uint64), c_int, c_uint64, c_uint64, c_int64, c_void_p]),
    'sf_layer_shape': (c_int, [c_void_p, POINTER(c_int64), POINTER(c_int64), POINTER(c_int)]),
    'sf_layer_compiled_count': (c_int, [c_void_p]),
    'sf_compile': (c_int, [c_void_p, c_char_p, c_char_p, POINTER(sf_compile_options), POINTER(c_void_p)]),
    'sf_compile_canonical_options': (c_int, [c_void_p, POINTER(sf_compile_options), POINTER(c_void_p)]),
    'sf_nvrtc_version': (c_int, [POINTER(c_int), POINTER(c_int)]),
    'sf_time_dense_gemm': (c_int, [c_void_p, POINTER(sf_gemm_desc), POINTER(sf_timing_options), POINTER(sf_gemm_timing)]),
    'sf_time_blocked_ell': (c_int, [c_void_p, POINTER(sf_blocked_ell_desc), POINTER(sf_timing_options), POINTER(sf_timing)]),
    'sf_time_csr': (c_int, [c_void_p, POINTER(sf_csr_desc), POINTER(sf_timing_options), POINTER(sf_csr_timing)]),
    'sf_time_sparselt': (c_int, [c_void_p, POINTER(sf_sparselt_desc), POINTER(sf_timing_options), POINTER(sf_sparselt_timing)]),
    'sf_cache_open': (c_int, [c_char_p, c_int, POINTER(c_void_p)]),
    'sf_cache_close': (None, [c_void_p]),
    'sf_cache_errmsg': (c_char_p, [c_void_p]),
    'sf_cache_errcode': (c_int, [c_void_p]),
    'sf_binary_key_hex': (c_int, [POINTER(sf_binary_key), c_char * 65]),
    'sf_cache_put_binary': (c_int, [c_void_p, POINTER(sf_binary_key), c_void_p]),
    'sf_cache_get_binary': (c_int, [c_void_p, POINTER(sf_binary_key), POINTER(c_void_p)]),
    'sf_cache_put_env': (c_int, [c_void_p, POINTER(sf_device_info), c_char * 65]),
    'sf_cache_envs': (c_int, [c_void_p, sf_env_cb, c_void_p]),
    'sf_cache_put_matrix': (c_int, [c_void_p, POINTER(sf_matrix_record)]),
    'sf_cache_matrices': (c_int, [c_void_p, c_char_p, sf_matrix_cb, c_void_p]),
    'sf_cache_put_trial': (c_int, [c_void_p, POINTER(sf_trial)]),
    'sf_cache_trials': (c_int, [c_void_p, POINTER(sf_trial_filter), sf_trial_cb, c_void_p]),
    'sf_cache_put_layer': (c_int, [c_void_p, POINTER(sf_layer_record)]),
    'sf_cache_layers': (c_int, [c_void_p, c_char_p, sf_layer_cb, c_void_p]),
    'sf_cache_delete_layer': (c_int, [c_void_p, c_char_p]),
    'sf_cache_merge': (c_int, [c_void_p, c_char_p, POINTER(c_int64), sf_skip_cb, c_void_p]),
    'sf_cache_export': (c_int, [c_void_p, c_char_p, POINTER(c_char_p), POINTER(c_int64), sf_skip_cb, c_void_p]),
    'sf_cache_count': (c_int, [c_void_p, POINTER(sf_cache_counts)]),
    'sf_layer_open': (c_int, [c_void_p, c_void_p, c_char_p, POINTER(c_void_p)]),
}
