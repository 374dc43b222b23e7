// The stream handle every CUDA kernel wrapper takes. It is CUDA's own `cudaStream_t` spelled
// without including a CUDA header (`cudaStream_t` is `struct CUstream_st*`), so that headers of the
// layers above can name it while staying plain C++. Pass nullptr for the legacy default stream;
// the CUDA device maps its StreamIds to these handles (CudaDevice::cuda_stream).
#pragma once

struct CUstream_st;

namespace zinf::kernels::cuda {

using Stream = CUstream_st*;

}  // namespace zinf::kernels::cuda
