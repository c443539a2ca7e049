"""examples/train_fsdp.py's character transformer on PyTorch DDP, a codec in the DDP comm hook:
the same model, data, minibatches, optimizer and steps, so its losses compare with the FSDP2 runs.

Run (4 processes on gloo, 1-bit SGD through the two-phase pattern):

    .venv/bin/torchrun --standalone --nproc_per_node 4 examples/train_lm_ddp.py --codec onebit --json

``--codec``: ``none`` (DDP's own allreduce) or a name in ``hgc.available_codecs()`` (through
``hgc.ddp.register(ddp, codec, optimizer=opt, pattern=...)``); ``--pattern``: the exchange's pattern
(``two_phase`` by default: every rank encodes, each owner decodes and sums its 1/K and encodes the
sum again for everyone, the pattern whose first half FSDP2's compressed reduce-scatter is);
``--codec-opt KEY=VALUE`` passes options to the codec. With ``--json`` rank 0 prints one JSON object
as its last line (the fields of examples/train_fsdp.py's, ``stats()`` of the hook).
"""
from __future__ import annotations

import json

import torch
import torch.distributed as dist

import horovod_gradcomp as hgc
from common import load_text, parse_codec_args
from train_fsdp import CharTransformer, make_optimizer, summarize, train, training_parser


def parse_args(argv=None):
    p = training_parser(__doc__.split("\n\n")[0], "none (DDP's own allreduce) or a codec name")
    p.add_argument("--pattern", default="two_phase", help="the codec's exchange pattern (two_phase)")
    args = parse_codec_args(p, argv, ["none", *hgc.available_codecs()])
    if args.codec == "none" and args.options:
        p.error("--codec-opt needs a codec (--codec none is DDP's own allreduce)")
    return args


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group("gloo")
    x_tr, y_tr, x_te, y_te, vocab = load_text(args.context)
    torch.manual_seed(args.seed)     # the same initial parameters as examples/train_fsdp.py's build()
    model = torch.nn.parallel.DistributedDataParallel(
        CharTransformer(vocab, args.context, args.width, args.heads, args.layers))
    opt = make_optimizer(args, model.parameters())
    state = None
    if args.codec != "none":
        state = hgc.ddp.register(model, args.codec, optimizer=opt, pattern=args.pattern, **args.options)
    else:
        hgc.ddp.hold_backward_context(model)   # gloo's abort at exit (horovod_gradcomp/ddp/gloo_exit.py)
    losses, elapsed = train(model, opt, args, x_tr, y_tr, dist.get_rank())
    result = summarize(args, model, losses, elapsed, x_te, y_te, path="ddp",
                       pattern=None if state is None else args.pattern)
    result["stats"] = None if state is None else state.stats()
    if dist.get_rank() == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"DDP {args.codec}: loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}, "
                  f"test {result['test_loss']:.3f}, {elapsed:.1f}s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
