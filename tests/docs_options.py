"""The factory options the guide quotes, found in its pages, and the options the code has.

Three kinds of quote are collected from README.md and docs/ (not docs/results/, whose
measurements name the options of their day, nor the changelog, which names old defaults):

* calls in Python code blocks (``hgc.Compression.onebit(model.named_parameters(), scales=...)``):
  every keyword must be an option of that factory; a keyword whose line ends in a comment that
  starts with "default" or "the default" must have the factory's default as its value;
* calls in inline code whose positional arguments are all bare names or ``*``/``**`` forms, as a
  signature is quoted (``onebit(named_parameters, error_feedback=True)``, in a table or in
  prose): every keyword must be an option and its value the default;
* prose that states a default: ```name=value` (the default)`` and ```name` (default value)``:
  some factory must have option ``name`` with that default.

The code side: the signatures of ``hgc.Compression.<factory>``, ``Compression.codec``, the codec
classes (the factories pass ``**options`` on to them), ``hgc.ddp.register`` and
``hgc.get_codec``. Where a signature's default is None and means another value, that value is
read from the code (:func:`effective_default`); where the factories replace a codec's constructor
default (the codec's ``adapter_defaults``), theirs is the default. A default that depends on the
optimizer (an option of the codec's ``adam_defaults`` whose signature default is None) is quoted
as None: quoting its SGD value as "the default" fails (:func:`default_quote_error`).
"""
from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from docs_blocks import ROOT, all_blocks

#: Pages not checked: measurement diaries and the history of defaults.
SKIPPED = ("docs/results/", "docs/guide/changelog.md")
#: ``hgc.ddp.register`` refuses these (DDP's buckets and group decide them).
REGISTER_REFUSED = {"bucket_bytes", "overlap", "transport", "process_set"}
NO_DEFAULT = inspect.Parameter.empty


@dataclass(frozen=True)
class Quote:
    """``option=value`` as a page quotes it for ``target`` (e.g. "Compression.onebit")."""
    where: str            # page:line
    target: str
    codec: Optional[str]  # the codec the call is about, when the page names it
    option: str
    value: object         # the literal value, or ``...`` where it is not a literal
    is_default: bool      # the page says this value is the default


def _params(fn) -> Dict[str, object]:
    """Named parameters of ``fn`` -> default (``NO_DEFAULT`` if none); ``**kw`` as ``"**"``."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            out["**"] = NO_DEFAULT
        elif p.kind is not p.VAR_POSITIONAL:
            out[p.name] = p.default
    return out


def options_of(target: str, codec: Optional[str]) -> List[Dict[str, object]]:
    """The signatures an option of ``target`` (about ``codec``, None: any) may come from, most
    specific first (the first that names an option gives its default)."""
    import horovod_gradcomp as hgc
    from horovod_gradcomp.codecs.registry import codec_class

    codecs = [codec] if codec else hgc.available_codecs()
    if target == "get_codec":
        return [_params(codec_class(c)) for c in codecs]
    if target == "ddp.register":
        own = _params(hgc.ddp.register)
        rest = [s for c in codecs for s in options_of(f"Compression.{c}" if hasattr(hgc.Compression, c)
                                                       else "Compression.codec", c)]
        return [own] + [{k: v for k, v in s.items() if k not in REGISTER_REFUSED} for s in rest]
    name = target.split(".", 1)[1]
    sigs = [_params(getattr(hgc.Compression, name))]
    if "**" in sigs[0] and name != "codec":
        sigs.append(_params(hgc.Compression.codec))
    if "**" in sigs[-1]:
        sigs += [_params(codec_class(c)) for c in codecs if c in hgc.available_codecs()]
    return sigs


def effective_default(option: str, default, codec: Optional[str]):
    """What a None default of ``option`` stands for, read from the code; else ``default``."""
    if default is not None or codec is None:
        return default
    import horovod_gradcomp as hgc
    from horovod_gradcomp.codecs.registry import codec_class
    if codec not in hgc.available_codecs():
        return default
    cls = codec_class(codec)
    if option == "error_feedback":
        return cls.error_feedback_default
    if option == "pattern":
        return cls.default_pattern
    if codec == "dgc" and option == "density":   # the SGD default (the Adam family's: adam_defaults)
        return cls.DEFAULT_DENSITY
    if codec == "qsgd" and option == "bits":   # levels s = 2^(bits-1) - 1 when neither is given
        return (hgc.get_codec("qsgd", impl="reference").s + 1).bit_length()
    return default


def _literal(quote: Quote):
    """(accepted?, the signature's own default of the option, or NO_DEFAULT)."""
    for sig in options_of(quote.target, quote.codec):
        if quote.option in sig:
            return True, sig[quote.option]
    return False, NO_DEFAULT


def adapter_default(quote: Quote):
    """The factories' replacement of a codec constructor default (``adapter_defaults``), or
    NO_DEFAULT: it applies to every target but ``get_codec``."""
    import horovod_gradcomp as hgc
    from horovod_gradcomp.codecs.registry import codec_class
    if quote.target == "get_codec" or quote.codec not in hgc.available_codecs():
        return NO_DEFAULT
    return codec_class(quote.codec).adapter_defaults.get(quote.option, NO_DEFAULT)


def optimizer_dependent(quote: Quote) -> bool:
    """True when the option's default differs under the Adam family (``adam_defaults``)."""
    import horovod_gradcomp as hgc
    from horovod_gradcomp.codecs.registry import codec_class
    return quote.codec in hgc.available_codecs() and quote.option in codec_class(quote.codec).adam_defaults


def lookup(quote: Quote):
    """(accepted?, the default of the option, or NO_DEFAULT)."""
    found, literal = _literal(quote)
    if not found:
        return False, NO_DEFAULT
    adapted = adapter_default(quote)
    if adapted is not NO_DEFAULT:
        return True, adapted
    return True, effective_default(quote.option, literal, quote.codec)


def default_quote_error(quote: Quote) -> Optional[str]:
    """Why ``quote`` (a value the page calls the default) is not the code's default, or None
    when it is (or the option is unknown: :func:`lookup` reports that)."""
    found, literal = _literal(quote)
    if not found:
        return None
    if literal is NO_DEFAULT:
        return "the code's has no default"
    _, effective = lookup(quote)
    if literal is None and effective is not None and optimizer_dependent(quote):
        if quote.value is None:
            return None
        from horovod_gradcomp.codecs.registry import codec_class
        adam = codec_class(quote.codec).adam_defaults[quote.option]
        return (f"the signature's default is None, which means {effective!r} under SGD and {adam!r} under the "
                "Adam family: quote None")
    if quote.value == effective or (quote.value is None and literal is None):
        return None
    return f"the code's is {effective!r}" + (" (None in the signature)" if literal is None else "")


# --- reading the pages ------------------------------------------------------------------------

FACTORIES = ("none", "fp16", "codec", "onebit", "terngrad", "qsgd", "dgc")


def _target(func: ast.expr) -> Optional[str]:
    """The known callable a call's function names (its dotted name's tail), else None."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    parts.reverse()
    if len(parts) >= 2 and parts[-2] == "Compression" and parts[-1] in FACTORIES:
        return f"Compression.{parts[-1]}"
    if len(parts) >= 2 and parts[-2:] == ["ddp", "register"]:
        return "ddp.register"
    if parts[-1:] == ["get_codec"]:
        return "get_codec"
    if len(parts) == 1 and parts[0] in FACTORIES:   # a table column headed `hgc.Compression.`
        return f"Compression.{parts[0]}"
    return None


def _codec_of(target: str, call: ast.Call) -> Optional[str]:
    if target.startswith("Compression.") and target != "Compression.codec":
        return target.split(".", 1)[1]
    index = 1 if target == "ddp.register" else 0
    args = list(call.args)
    named = {k.arg: k.value for k in call.keywords if k.arg}
    node = args[index] if len(args) > index else named.get("codec" if target == "ddp.register" else "name")
    if target == "ddp.register" and node is None:
        return "onebit"   # register's default codec
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _value(node: ast.expr):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...


def _calls(tree: ast.AST) -> Iterator[tuple]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            target = _target(node.func)
            if target is not None:
                yield node, target


DEFAULT_COMMENT = re.compile(r"#\s*(?:the )?default\b", re.IGNORECASE)


def block_quotes(path: str, first_line: int, code: str) -> Iterator[Quote]:
    """The keywords of known calls in one Python block; default-commented ones are defaults."""
    lines = code.splitlines()
    for call, target in _calls(ast.parse(code)):
        codec = _codec_of(target, call)
        for kw in call.keywords:
            if kw.arg is None:
                continue
            comment = lines[kw.value.end_lineno - 1].split("#", 1)
            said = len(comment) == 2 and bool(DEFAULT_COMMENT.match("#" + comment[1]))
            yield Quote(f"{path}:{first_line + kw.lineno}", target, codec, kw.arg, _value(kw.value), said)


INLINE = re.compile(r"`([^`\n]+)`")
PROSE_DEFAULT = [
    re.compile(r"`(\w+)=([^`]+)`\s*\((?:the |its )?default\b"),              # `k=v` (the default)
    re.compile(r"`(\w+)(?:=[^`]*)?`\s*\(default:? ([^)\s;,]+)(?=[);,])"),   # `k` (default v)
]


def _signature_like(call: ast.Call) -> bool:
    return bool(call.args) and all(isinstance(a, (ast.Name, ast.Starred)) for a in call.args)


def _paragraphs(text: str) -> Iterator[tuple]:
    """(first line number, text joined into one line) of each paragraph outside fenced blocks,
    so that inline code wrapped over two lines is read whole; a table row is its own paragraph."""
    fenced, start, buf = False, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*(```|~~~)", line):
            fenced = not fenced
        if fenced or not line.strip() or line.lstrip().startswith(("```", "~~~", "|")):
            if buf:
                yield start, " ".join(buf)
                buf = []
            if not fenced and line.lstrip().startswith("|"):
                yield number, line
            continue
        if not buf:
            start = number
        buf.append(line.strip())
    if buf:
        yield start, " ".join(buf)


def page_quotes(path: str, text: str) -> Iterator[Quote]:
    """Inline-code calls and prose defaults of one page (outside its fenced blocks)."""
    for number, para in _paragraphs(text):
        for span in INLINE.findall(para):
            try:
                tree = ast.parse(span.strip(), mode="eval")
            except SyntaxError:
                continue
            for call, target in _calls(tree):
                sig = _signature_like(call)
                codec = _codec_of(target, call)
                for kw in call.keywords:
                    if kw.arg is not None:
                        yield Quote(f"{path}:{number}", target, codec, kw.arg, _value(kw.value), sig)
        for pattern in PROSE_DEFAULT:
            for name, raw in pattern.findall(para):
                try:
                    value = ast.literal_eval(raw.strip())
                except (ValueError, SyntaxError):
                    continue
                yield Quote(f"{path}:{number}", "prose", None, name, value, True)


def checked_pages(root: Path = ROOT) -> List[Path]:
    pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
    return [p for p in pages if not str(p.relative_to(root)).startswith(SKIPPED)]


def all_quotes(root: Path = ROOT) -> List[Quote]:
    out: List[Quote] = []
    for block in all_blocks(root):
        if not block.path.startswith(SKIPPED):
            out += block_quotes(block.path, block.line, block.code)
    for page in checked_pages(root):
        rel = str(page.relative_to(root))
        out += page_quotes(rel, page.read_text(encoding="utf-8"))
    return out


def prose_default_holds(quote: Quote) -> bool:
    """Some factory or codec has option ``quote.option`` with default ``quote.value``."""
    import horovod_gradcomp as hgc
    targets = [f"Compression.{f}" for f in FACTORIES] + ["ddp.register"]
    for target in targets:
        codecs = [target.split(".")[1]] if target.split(".")[1] in hgc.available_codecs() else hgc.available_codecs()
        for codec in codecs:
            found, default = lookup(Quote(quote.where, target, codec, quote.option, quote.value, True))
            if found and default is not NO_DEFAULT and default == quote.value and type(default) is type(quote.value):
                return True
    return False
