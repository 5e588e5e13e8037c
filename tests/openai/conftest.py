import sys
from pathlib import Path

# the tritonserver launcher and the successor checkpoint of tests/serving, and openai_server.py here
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1] / "serving")]
