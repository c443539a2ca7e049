"""The digits example under Horovod elastic: workers may leave or join during training.

Run (3 workers on this machine; see examples/discover_hosts.sh):

    .venv/bin/horovodrun --gloo -np 3 --min-np 2 --max-np 3 \\
        --host-discovery-script examples/discover_hosts.sh \\
        .venv/bin/python examples/train_elastic.py --codec onebit --json

The compression's state lives in ``hgc.elastic.TorchState`` next to the model and the
optimizer (see :mod:`horovod_gradcomp.elastic` for what a membership change does to it).
Data: every epoch one permutation of the training set, shared by all ranks; each step
consumes the next ``size x batch`` samples (rank r takes its ``batch``-sized part), and the
state records the position, so after a change of size training resumes where the last
commit left it, with the new size. ``--kill-host H --kill-epoch E``: the worker launched on
host name H kills itself (SIGKILL) at the middle of epoch E, once, to test the recovery.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod_gradcomp as hgc
from common import load_data, params_digest
from train import codec_options, make_compression, parse_args


def main(argv=None):
    extra = [a for a in (argv if argv is not None else sys.argv[1:])]
    kill_host, kill_epoch, commit_every = None, -1, 5
    for flag in ("--kill-host", "--kill-epoch", "--commit-every"):
        if flag in extra:
            i = extra.index(flag)
            value = extra[i + 1]
            del extra[i:i + 2]
            if flag == "--kill-host":
                kill_host = value
            elif flag == "--kill-epoch":
                kill_epoch = int(value)
            else:
                commit_every = int(value)
    args = parse_args(extra)
    hvd.init()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te = load_data(args.seed)
    model = nn.Sequential(nn.Linear(x_tr.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    compression = make_compression(args.codec, model, codec_options(args.codec_opt), args.momentum)
    own_momentum = isinstance(getattr(compression, "memory", None), hgc.DGCMemory)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.0 if own_momentum else args.momentum),
        named_parameters=model.named_parameters(), compression=compression)
    state = hgc.elastic.TorchState(model, optimizer, compression=compression, epoch=0, offset=0, sizes=[])
    me = os.environ.get("HOROVOD_HOSTNAME")
    t0 = time.perf_counter()

    @hvd.elastic.run
    def train(state):
        bs = args.batch_size
        while state.epoch < args.epochs:
            size, rank = hvd.size(), hvd.rank()
            if not state.sizes or state.sizes[-1] != size:
                state.sizes = state.sizes + [size]
            if hasattr(compression, "set_epoch"):
                compression.set_epoch(state.epoch)
            perm = torch.randperm(len(x_tr), generator=torch.Generator().manual_seed(args.seed * 1000 + state.epoch))
            steps = 0
            while state.offset + size * bs <= len(x_tr):
                if me == kill_host and state.epoch == kill_epoch and state.offset >= len(x_tr) // 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                idx = perm[state.offset + rank * bs:state.offset + (rank + 1) * bs]
                optimizer.zero_grad()
                F.cross_entropy(model(x_tr[idx]), y_tr[idx]).backward()
                optimizer.step()
                state.offset += size * bs
                steps += 1
                if steps % commit_every == 0:
                    state.commit()
            state.epoch, state.offset = state.epoch + 1, 0
            state.commit()

    train(state)
    seconds = time.perf_counter() - t0
    digests = hvd.allgather_object(params_digest(model))
    identical = len(set(digests)) == 1
    if hvd.rank() == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        print(f"[elastic {args.codec}] sizes {state.sizes}, {args.epochs} epochs: test accuracy {acc:.4f}, "
              f"{seconds:.1f} s, params identical across ranks: {identical}", flush=True)
        if args.json:
            print(json.dumps({"codec": args.codec, "sizes": state.sizes, "ranks": hvd.size(), "epochs": args.epochs,
                              "test_accuracy": acc, "params_identical": identical, "seconds": seconds,
                              "stats": compression.stats()}), flush=True)
    hvd.shutdown()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
