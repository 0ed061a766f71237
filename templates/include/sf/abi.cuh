// abi.cuh -- the codes the device code shares with the C library: GENERATED
// from runtime/sparseforge_runtime.h by generator/tools/abi.py; edit the header
// (SF_ACTIVATION_TABLE), not this file.
#pragma once

namespace sf {

// The fused epilogue's activation (sf_activation).
enum Activation { ACT_NONE = 0, ACT_RELU = 1, ACT_GELU = 2 };

}  // namespace sf
