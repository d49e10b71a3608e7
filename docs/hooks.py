"""mkdocs hook (named in mkdocs.yml): adds the configuration reference, generated from the schema
by `rmtjax.docs_reference`, as the page `reference/config.md` of the site being built."""

import sys
from pathlib import Path

# the checkout this site is built from, ahead of any installed rmtjax
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mkdocs.structure.files import File  # noqa: E402

from rmtjax import docs_reference  # noqa: E402


def on_files(files, config):
    files.append(File.generated(config, docs_reference.PAGE, content=docs_reference.render()))
    return files
