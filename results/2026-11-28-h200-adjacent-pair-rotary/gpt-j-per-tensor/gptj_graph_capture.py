import copy, traceback, torch, xkernels
from transformers import GPTJConfig, GPTJForCausalLM
from xkernels.harness import model_runs, resolve_target
target = resolve_target("cuda")
cfg = GPTJConfig(n_embd=256, n_head=4, n_layer=2, rotary_dim=32, vocab_size=512, n_positions=256)
cfg._attn_implementation = "eager"
torch.manual_seed(0)
base = GPTJForCausalLM(cfg).to("cuda", torch.bfloat16)
inputs = {"input_ids": torch.randint(0, 512, (1, 16), device="cuda")}
for way in ("torch", "patch"):
    m = copy.deepcopy(base)
    if way == "patch":
        print(xkernels.patch(m).counts())
    try:
        r = model_runs.make_runner("cudagraph", m, inputs, target)
        r.forward(); torch.cuda.synchronize(); print(way, "captured ok")
    except Exception as e:
        print(way, "FAILED:", type(e).__name__, str(e)[:200])
        traceback.print_exc(limit=-6)
