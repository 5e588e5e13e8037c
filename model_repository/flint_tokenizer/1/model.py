"""flint_tokenizer: a request's tensors -> prompt ids + sampling parameters + output config
(flint_backend.serving.preprocess). Bad requests get an error response naming the field."""

import json
import os
import sys
from pathlib import Path

# The Python backend's stub ignores PYTHONPATH; the launcher puts the project on it.
sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from flint_backend.serving import repository  # noqa: E402
from flint_backend.serving.preprocess import Preprocessor  # noqa: E402
from flint_backend.serving.tensors import bytes_tensor  # noqa: E402
from flint_backend.tokenizer import load_tokenizer  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = repository.model_parameters(config)
        self.input_names = [i["name"] for i in config["input"]]
        engine_args = repository.load_engine_args(
            repository.engine_args_path(Path(args["model_repository"]).parent, params["engine_model"]))
        tokenizer = load_tokenizer(repository.tokenizer_dir(engine_args))
        self.preprocess = Preprocessor(tokenizer, repository.chat_options(params), int(params["default_max_tokens"]))

    def execute(self, requests):
        return [self._run(request) for request in requests]

    def _run(self, request):
        inputs = {}
        for name in self.input_names:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs[name] = tensor.as_numpy()
        try:
            out = self.preprocess(inputs)
        except ValueError as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(error), pb_utils.TritonError.INVALID_ARG))
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("prompt_ids", np.array([out.prompt_ids], np.int32)),
            pb_utils.Tensor("sampling_params", bytes_tensor(out.sampling_json)),
            pb_utils.Tensor("output_config", bytes_tensor(out.output_config.to_json())),
        ])
