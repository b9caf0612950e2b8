"""``python3 -m translation.serve``: translations over HTTP, requests gathered into searches.

One file per concept:

* ``requests.py``: what a ``POST /translate`` body may hold, each field checked, errors naming it.
* ``model.py``: ``ServedModel``, the checkpoint read once, a translator per target language.
* ``batcher.py``: ``Batcher``, the queue (bounded) and the one decoding thread that takes what is
  waiting, with the same search settings, into one search.
* ``app.py``: the Starlette application: ``/translate``, ``/`` (``page.html``), ``/health``.
* ``__main__.py``: the command line: options, uvicorn, a clean stop on SIGTERM.

Starlette and uvicorn are the optional extra ``.[serve]``; ``requests.py`` and ``batcher.py``
import neither.
"""
