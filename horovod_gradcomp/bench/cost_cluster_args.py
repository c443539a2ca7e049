"""The cluster options of ``bench model`` (``--nodes N``, ``--gpus-per-node``, ``--params``, ...):
argparse types that reject bad values with a message naming the problem, and the model's size
from ``--params``, ``--shapes-file`` or ``--model``.
"""
from __future__ import annotations

import argparse
import json
import math
from typing import List, Optional, Tuple

from .shapes import Shape, resnet50_shapes, total_numel

#: Models known by name: name -> a function giving their parameter shapes.
NAMED_MODELS: dict = {"resnet50": resnet50_shapes}
class _NodesTable:
    """``--nodes`` given without a number (not a string: argparse would pass it to the type)."""

    def __repr__(self) -> str:
        return "NODES_TABLE"


#: ``--nodes`` with no number: the N x L table over several node counts.
NODES_TABLE = _NodesTable()


def _number(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A number > 0 (a link rate)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (a count of nodes or GPUs)."""
    value = _number(text)
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(value)


def param_count(text: str) -> int:
    """A parameter count >= 1, in any float notation (``1.3e9``), rounded to a whole number."""
    value = _number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return int(round(value))


def shapes_file(path: str) -> List[Shape]:
    """The parameter shapes in a JSON file: a list of shapes (``[[64, 3, 7, 7], [64]]``) or an
    object of name -> shape; every dimension a whole number >= 1, at least one shape."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{path!r} is not JSON: {exc}") from None
    items = list(data.values()) if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise argparse.ArgumentTypeError(f"{path!r}: expected a non-empty list of shapes or an object of name -> shape")
    shapes = []
    for s in items:
        if not isinstance(s, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in s):
            raise argparse.ArgumentTypeError(f"{path!r}: a shape must be a list of whole numbers >= 1, got {s!r}")
        shapes.append(tuple(s))
    return shapes


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The model options of the cluster form (the layout options are ``model_command``'s)."""
    group = parser.add_argument_group("the model priced with --nodes N (one of)")
    one = group.add_mutually_exclusive_group()
    one.add_argument("--params", type=param_count, default=None, metavar="N",
                     help="number of parameters (e.g. 1.3e9)")
    one.add_argument("--shapes-file", type=shapes_file, default=None, metavar="JSON",
                     help="parameter shapes: a JSON list of shapes, or an object of name -> shape")
    one.add_argument("--model", choices=sorted(NAMED_MODELS), default=None, help="a model known by name")


def model_shapes(args: argparse.Namespace) -> Optional[List[Shape]]:
    """The parameter shapes of the model the options name, when known (not with ``--params``)."""
    if args.shapes_file is not None:
        return list(args.shapes_file)
    if args.model is not None:
        return NAMED_MODELS[args.model]()
    return None


def model_size(args: argparse.Namespace) -> Optional[Tuple[int, str]]:
    """(values, description) of the model the options name, or None when none is named."""
    if args.params is not None:
        return args.params, f"{args.params:,} parameters (--params)"
    if args.shapes_file is not None:
        return total_numel(args.shapes_file), f"{total_numel(args.shapes_file):,} parameters in " \
                                              f"{len(args.shapes_file)} tensors (--shapes-file)"
    if args.model is not None:
        shapes = NAMED_MODELS[args.model]()
        return total_numel(shapes), f"{args.model}: {total_numel(shapes):,} parameters in {len(shapes)} tensors"
    return None
