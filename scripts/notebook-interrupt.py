"""Kernel > Interrupt during a GRPO loop, as Jupyter sends it, under the Deno or tslab kernel.

    /usr/bin/python3 scripts/notebook-interrupt.py deno|tslab

Starts the kernel registered in .jupyter/ (npm run kernels) with jupyter_client (Debian's jupyter-client), loads
models/tictactoe-tiny into a TrainableModel, runs a loop of gather + train steps with a progress bar, interrupts
the kernel once two steps are done, then runs further cells: the model's step and checkpoints, read twice three
seconds apart (a loop still running in the background would move them), and one completion from the same
engine. Prints one JSON object; the caller (test/notebook/notebooks.test.ts) judges it.
"""
import json
import os
import sys
import tempfile
import time

from jupyter_client.manager import start_new_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETUP = """
import { gatherTrajectoryGroups, progress, TrainableModel, Trajectory, type Choice } from "art-ts";
const model = await TrainableModel.load({
  name: "interrupted", project: "interrupt-check", baseModel: %(base)s, artDir: %(art)s, log: () => {},
});
const client = model.openai();
async function rollout(seed: number): Promise<Trajectory> {
  const messages = [{ role: "user" as const, content: "xo_\\n_x_\\no__" }];
  const completion = await client.chat.completions.create({ model: model.name, messages, max_tokens: 8, temperature: 1, seed, logprobs: true });
  const choice = completion.choices[0] as Choice;
  return new Trajectory({ messagesAndChoices: [...messages, choice], reward: (choice.message.content ?? "").length });
}
"""

LOOP = """
const bar = progress(40, "train");
for (let step = 0; step < 40; step++) {
  const groups = await gatherTrajectoryGroups([Array.from({ length: 4 }, (_, i) => () => rollout(step * 10 + i))], { progress: false });
  await model.train(groups, { learningRate: 1e-3 });
  bar.update(1);
  console.log(`trained step ${model.step}`);
}
"""

STATE = """console.log("STATE " + JSON.stringify({ step: model.step, checkpoints: model.checkpoints() }));"""

COMPLETION = """
const reply = await client.chat.completions.create({ model: model.name, messages: [{ role: "user", content: "___\\n___\\n___" }], max_tokens: 4 });
console.log("COMPLETION " + JSON.stringify({ choices: reply.choices.length }));
"""


def run_cell(kc, code, timeout=120):
    """Runs one cell; returns (status, stream text, error outputs)."""
    texts, errors = [], []

    def hook(msg):
        if msg["msg_type"] == "stream":
            texts.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(f'{msg["content"]["ename"]}: {msg["content"]["evalue"]}')

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    # Deno's kernel can publish a cell's last output just after the cell went idle (seen once in CI, on a loaded
    # machine): collect what still comes for this cell for a moment.
    msg_id = reply["parent_header"].get("msg_id")
    deadline = time.time() + 2
    while time.time() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=0.2)
        except Exception:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            hook(msg)
    return reply["content"]["status"], "".join(texts), errors


def main(kernel):
    os.environ["JUPYTER_PATH"] = os.path.join(ROOT, ".jupyter")
    art_dir = tempfile.mkdtemp(prefix="art-ts-interrupt-")
    result = {"kernel": kernel}
    km, kc = start_new_kernel(kernel_name=kernel, cwd=os.path.join(ROOT, "notebooks"))
    try:
        base = json.dumps(os.path.join(ROOT, "models", "tictactoe-tiny"))
        status, text, errors = run_cell(kc, SETUP % {"base": base, "art": json.dumps(art_dir)})
        result["setup"] = {"status": status, "errors": errors}
        if status != "ok":
            return result

        # The loop, interrupted once two steps are done.
        msg_id = kc.execute(LOOP)
        started, texts, errors, interrupted_at = time.time(), [], [], None
        while time.time() - started < 300:
            try:
                msg = kc.get_iopub_msg(timeout=1)
            except Exception:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                texts.append(content["text"])
                if interrupted_at is None and "trained step 2" in "".join(texts):
                    km.interrupt_kernel()
                    interrupted_at = time.time()
            elif kind == "error":
                errors.append(f'{content["ename"]}: {content["evalue"]}')
            elif kind == "status" and content["execution_state"] == "idle":
                break
        result["loop"] = {
            "interrupted": interrupted_at is not None,
            "seconds_to_stop": None if interrupted_at is None else round(time.time() - interrupted_at, 2),
            "output": "".join(texts), "errors": errors, "alive": km.is_alive(),
        }
        if not km.is_alive():
            return result

        time.sleep(3)  # tslab aborts requests that arrive right after an interrupt
        states = []
        for _ in range(2):
            status, text, errors = run_cell(kc, STATE)
            states.append(json.loads(text.split("STATE ", 1)[1]) if "STATE " in text else {"status": status, "errors": errors})
            time.sleep(3)
        result["states"] = states
        status, text, errors = run_cell(kc, COMPLETION)
        result["completion"] = json.loads(text.split("COMPLETION ", 1)[1]) if "COMPLETION " in text else {"status": status, "errors": errors}
        return result
    finally:
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
