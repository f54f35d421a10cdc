import sys
from pathlib import Path

# Import the engines from this checkout, whatever is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
