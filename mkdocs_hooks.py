"""MkDocs hook (mkdocs.yml ``hooks:``): the docstrings cross-reference with Sphinx roles
(``:func:`x```, ``:class:`~a.b.C```), which Markdown renders as ``:func:`` before a code span.
Drop the role and the ``~`` so the API reference shows the name alone."""
import re

_ROLE = re.compile(r":(?:meth|func|class|mod|attr|data|exc|obj):(<code>)~?")


def on_page_content(html, page, config, files):
    return _ROLE.sub(r"\1", html)
