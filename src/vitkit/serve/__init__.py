"""``vitkit serve``: a classifier behind HTTP, requests batched dynamically (the ``serve`` extra).

:func:`create_app` builds the ASGI app around a :class:`ServedModel`; :func:`serve` loads weights
on a runtime and runs the app on uvicorn, draining on SIGTERM. Nothing here is needed to predict
in Python: ``vitkit.evaluate.predict_images`` is the same answer without a server.
"""

from .app import ServeOptions, create_app
from .model import ServedModel
from .server import serve

__all__ = ["ServeOptions", "ServedModel", "create_app", "serve"]
