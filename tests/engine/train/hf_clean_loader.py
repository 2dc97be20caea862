"""Run as a script with ``python -I``: loads ``model/hf/`` exports with transformers while any
import of this project fails, and prints the largest difference from the given outputs."""

import importlib.abc
import json
import sys

OURS = ("engine", "service", "worker", "api_schemas", "client", "tests", "bench")


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in OURS:
            raise ImportError(f"{name} is part of the project and must not be imported here")
        return None


sys.meta_path.insert(0, _Refuse())

import torch  # noqa: E402
import transformers  # noqa: E402


def main(path):
    results = []
    for req in json.loads(open(path).read()):
        auto = getattr(transformers, req["auto"])
        model = auto.from_pretrained(req["dir"], trust_remote_code=True).eval()
        ids = torch.tensor(req["ids"])
        mask = torch.tensor(req["mask"])
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask.long())
        got = out.logits if hasattr(out, "logits") else out.last_hidden_state
        diff = (got - torch.tensor(req["out"]))[mask].abs().max().item()
        res = {"class": type(model).__name__, "max_abs_diff": diff}
        if req["auto"] == "AutoModelForCausalLM":
            gen = model.generate(ids[:1, :4], max_new_tokens=5, do_sample=False, min_new_tokens=5)
            res["generated"] = gen.shape[1] - 4
        results.append(res)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
