"""Runs the ReplaySSM authors' GDN decode kernel (from ../shared/peer_bench) in a plain loop,
for Nsight Compute beside `scripts/ncu_kernels.py --family gdn`:

    cp -r ../shared/peer_bench .peer_bench     # once per checkout (git-ignored)
    ncu --kernel-name regex:replayssm --launch-skip 40 --launch-count 2 ... \\
        python3 scripts/ncu_peer_gdn.py --peer .peer_bench

Same inputs as the peer harness's timing (`bench_gdn`: Qwen3-Next shapes, fp32 state pools of
>= 512 MiB, bf16 d / k rings, staggered cursors); the kernel is only called, never changed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default=".peer_bench", help="the copied peer_bench folder")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--window", type=int, default=16)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(args.peer).resolve()))
    import peer_bench as pb
    import torch

    dev, act, L, batch = "cuda", torch.bfloat16, args.window, args.batch
    sh = pb.FULL_GDN
    layers = pb.n_layers(batch, sh.state_bytes(), 512 * 2**20)
    prm, scale = pb.gdn_params(sh, dev), sh.K ** -0.5
    ins = [pb.gdn_inputs(sh, batch, act, dev) for _ in range(L)]
    slots = batch + 1
    pools = [torch.randn(slots, sh.HV, sh.V, sh.K, device=dev) * 0.5 for _ in range(layers)]
    rings = [((torch.randn(slots, sh.HV, L, sh.V, device=dev) * 0.1).to(act),
              (torch.randn(slots, sh.H, L, sh.K, device=dev) * sh.K ** -0.5).to(act),
              -torch.empty(slots, sh.HV, L, device=dev).uniform_(0.01, 0.5))
             for _ in range(layers)]
    idx = (torch.randperm(batch, device=dev) + 1).to(torch.int32)
    out = torch.empty(batch, 1, sh.HV, sh.V, device=dev, dtype=act)
    _, stag, _ = pb.cursors(batch, L, dev)
    for s in range(args.steps):
        i, layer = ins[s % L], s % layers
        pb.rs_gdn_decode(i["mixed"], i["a"], i["b"], prm["A_log"], prm["dt_bias"], scale,
                         pools[layer], *rings[layer], out, idx, stag[s % L][0],
                         use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    print(f"ran {args.steps} steps of the authors' GDN replay at batch {batch} ({layers} layers)")


if __name__ == "__main__":
    main()
