"""``python -m mlexec.web``: serve the app with waitress on 0.0.0.0:$PORT (default 8000), debug off."""
import os

from waitress import serve

from . import app

serve(app, host="0.0.0.0", port=int(os.environ.get("PORT", "8000")))
