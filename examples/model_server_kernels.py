"""The model server's geometry and device kernels (C++ for the GPU backends, numpy twins
for sim; the matrix products on the NPU), and its postprocessing on the device: the
label (argmax) of each logits row.

    post = build_postprocess(rt, batch=8, classes=10, slots=2)
    run = await classifier.submit(x.outputs)        # logits stay on the device
    labels = await post.submit(run.outputs)         # copied in after the classifier's run
    (raw,) = await labels.download()                # i32 [batch], host-visible: read in place

Why: reading the logits back only to take an argmax on the host puts a host wait and a
transfer between the model and its last step; chained, the request waits once, at the
end. The kernel keeps the first maximum of each row (`numpy.argmax` for finite rows);
`argmax_host` is its twin for the sim backend, with the same rule.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import hrx_async as hrx

C, H, W, P = 3, 16, 16, 4
CELLS = (H // P) * (W // P)
K = C * P * P
D = 64
CLASSES = 10


def patchify(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    b = x.shape[0]
    cells = x.reshape(b, C, H // P, P, W // P, P).transpose(0, 2, 4, 1, 3, 5)
    return cells.reshape(b * CELLS, K)


# -- kernels: numpy for sim, CUDA C++ for the GPU backend; the matrix products on the NPU --

PATCHIFY_CXX = r"""
extern "C" __global__ void patchify(const float* x, float* patches) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;   // one patch element
    if (i >= BATCH * CELLS * K) return;
    const unsigned f = i % K, row = i / K, b = row / CELLS, cell = row % CELLS;
    const unsigned c = f / (P * P), py = (f / P) % P, px = f % P;
    const unsigned y = (cell / (W / P)) * P + py, xx = (cell % (W / P)) * P + px;
    patches[i] = x[((b * C + c) * H + y) * W + xx];
}
"""
POOL_CXX = r"""
extern "C" __global__ void bias_relu_pool(const float* h, const float* b1, float* pooled) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;   // one (batch, feature)
    if (i >= BATCH * D) return;
    const unsigned b = i / D, d = i % D;
    float sum = 0.0f;
    for (unsigned cell = 0; cell < CELLS; ++cell) {
        sum += fmaxf(h[(b * CELLS + cell) * D + d] + b1[d], 0.0f);
    }
    pooled[i] = sum / CELLS;
}
"""
BIAS_CXX = r"""
extern "C" __global__ void add_bias(const float* raw, const float* b2, float* logits) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < BATCH * CLASSES) logits[i] = raw[i] + b2[i % CLASSES];
}
"""


def f32(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return array.view(np.float32)


def patchify_host(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    x = f32(arrays[0]).reshape(-1, C, H, W)
    f32(arrays[1])[:] = patchify(x).reshape(-1)


def pool_host(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    h = np.maximum(f32(arrays[0]).reshape(-1, D) + f32(arrays[1]), np.float32(0))
    f32(arrays[2])[:] = h.reshape(-1, CELLS, D).mean(axis=1, dtype=np.float32).reshape(-1)


def bias_host(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
    raw = f32(arrays[0]).reshape(-1, CLASSES)
    f32(arrays[2])[:] = (raw + f32(arrays[1])).reshape(-1)


def matmul_host(m: int, k: int, n: int) -> Any:
    def matmul(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        a, b = f32(arrays[0]).reshape(m, k), f32(arrays[1]).reshape(k, n)
        np.matmul(a, b, out=f32(arrays[2]).reshape(m, n))

    return matmul


def contract(*bindings: tuple[int, hrx.Access]) -> hrx.KernelContract:
    return hrx.KernelContract([hrx.Binding(n * 4, access) for n, access in bindings])


R, WR = hrx.Access.READ, hrx.Access.WRITE


ARGMAX_CXX = r"""
extern "C" __global__ void argmax_rows(const float* logits, int* labels) {
    const unsigned b = blockIdx.x * blockDim.x + threadIdx.x;   // one row
    if (b >= BATCH) return;
    const float* row = logits + b * CLASSES;
    unsigned best = 0;
    for (unsigned c = 1; c < CLASSES; ++c) {
        if (row[c] > row[best]) best = c;
    }
    labels[b] = (int)best;
}
"""


def argmax_rows(logits: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The kernel's rule in numpy: the first index of each row's maximum, as i32."""
    best = np.zeros(logits.shape[0], np.int64)
    for c in range(1, logits.shape[1]):
        better = logits[:, c] > logits[np.arange(logits.shape[0]), best]
        best = np.where(better, c, best)
    return best.astype(np.int32)


def argmax_host(classes: int) -> Any:
    def kernel(arrays: list[np.ndarray[Any, Any]], constants: bytes) -> None:
        logits = arrays[0].view(np.float32).reshape(-1, classes)
        arrays[1].view(np.int32)[:] = argmax_rows(logits)

    return kernel


def build_postprocess(
    rt: hrx.Runtime, batch: int, classes: int, slots: int
) -> hrx.models.PreparedModel:
    """A prepared model: input "logits" f32 [batch, classes] (device memory, filled by a
    chained `submit`), output "labels" i32 [batch] in host-visible memory."""
    contract = hrx.KernelContract(
        [
            hrx.Binding(batch * classes * 4, hrx.Access.READ),
            hrx.Binding(batch * 4, hrx.Access.WRITE),
        ]
    )
    kernel = rt.load_gpu_kernel(
        hrx.KernelSource(cxx=ARGMAX_CXX, host=argmax_host(classes)),
        "argmax_rows",
        (math.ceil(batch / 128), 1, 1),
        (128, 1, 1),
        contract,
        defines={"BATCH": batch, "CLASSES": classes},
    )

    def factory(ctx: hrx.models.ModelContext, index: int) -> hrx.models.SlotIO:
        logits = ctx.tensor(hrx.models.TensorDesc("f32", (batch, classes)), hrx.GPU_LOCAL, "logits")
        labels = ctx.tensor(hrx.models.TensorDesc("i32", (batch,)), hrx.HOST_VISIBLE, "labels")
        g = rt.graph(f"argmax-b{batch}")
        g.gpu(kernel, [logits.view, labels.view])
        return hrx.models.SlotIO({"logits": logits}, {"labels": labels}, g.prepare())

    return hrx.models.PreparedModel(hrx.models.ModelContext(rt), slots, factory, f"argmax-b{batch}")
