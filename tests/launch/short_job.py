"""One short Horovod job for the crash loop (tests/test_horovod_contract_launch.py):
``python short_job.py CODEC ENDING``. Every rank builds CODEC's compression (``none`` and
``fp16`` too) and an ``hvd.DistributedOptimizer``, then ends as ENDING says:

* ``normal``: three training steps, then a normal exit;
* ``built``: exit right after building (no step);
* ``duplicate``: the optimizer gets duplicate parameter names: Horovod's ValueError before the
  first step, on every rank;
* ``one-step``: one training step, then an exception on every rank.

``faulthandler`` is on, so a native crash prints every thread's Python stack.
"""
import faulthandler
import sys

faulthandler.enable()

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import horovod_gradcomp as hgc  # noqa: E402

OPTIONS = {"dgc": {"momentum": 0.9, "check_optimizer": False, "density": 0.1}, "qsgd": {"bits": 4}}


def main(codec: str, ending: str) -> None:
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    comp = getattr(hgc.Compression, codec)(model.named_parameters(), **OPTIONS.get(codec, {}))
    named = list(model.named_parameters())
    if ending == "duplicate":
        named = [("same", p) for _, p in named]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named,
                                   compression=comp)
    for step in range({"built": 0, "one-step": 1, "normal": 3}[ending]):
        gen = torch.Generator().manual_seed(10 * step + hvd.rank())
        opt.zero_grad()
        model(torch.randn(4, 8, generator=gen)).sum().backward()
        opt.step()
    if ending == "one-step":
        raise RuntimeError(f"short job: rank {hvd.rank()} ends with an exception after one step")
    print(f"short job: rank {hvd.rank()} finished {codec} {ending}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
