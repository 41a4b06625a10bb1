"""The network as the lab's cpu.rs writes it: plain loops over Python floats, slow and obvious.

It shares no code with cnnlab, so agreeing with it means something.
"""

from __future__ import annotations


def reference_forward(image: list[list[float]], filters: list[list[list[float]]], weights: list[list[float]]) -> list[float]:
    conv = []
    for filt in filters:
        out = [[0.0] * 20 for _ in range(20)]
        for i in range(0, 100, 5):
            for j in range(0, 100, 5):
                total = -0.0  # Rust's f64 sum starts from -0.0
                for x in range(5):
                    for y in range(5):
                        total += image[i + x][j + y] * filt[x][y]
                out[i // 5][j // 5] = 0.0 if total < 0.0 else total
        conv.append(out)
    flattened = [value for matrix in conv for row in matrix for value in row]
    outputs = []
    for weight in weights:
        total = -0.0
        for a, b in zip(flattened, weight):
            total += a * b
        outputs.append(total)
    return outputs
