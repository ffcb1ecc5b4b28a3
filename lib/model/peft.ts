/**
 * LoRA adapters in PEFT's on-disk format: adapter_config.json + adapter_model.safetensors with keys
 * `base_model.model.model.layers.N.{self_attn|mlp}.{proj}.lora_{A|B}.weight`, A [r, in], B [out, r].
 * Anything PEFT writes for these architectures loads (rank and alpha from its config, rsLoRA honoured); what the
 * engine cannot apply (DoRA, bias training, modules_to_save, per-module rank/alpha patterns) is refused by name,
 * as is an adapter whose shapes belong to another model.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { ArtError } from "../core/errors.ts";
import type { ModelConfig } from "./config.ts";
import { type LayerLoras, type LoraConfig, loraScale, PROJECTIONS, type Projection, projectionPath, projectionShape } from "./lora.ts";
import { openSafetensors, writeSafetensors, type TensorToWrite } from "./safetensors.ts";
import type { Transformer } from "./transformer.ts";

export const ADAPTER_CONFIG_FILE = "adapter_config.json";
export const ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors";

/** A loaded adapter: its LoRA settings and A/B per (layer, projection). */
export interface Adapter {
  lora: LoraConfig;
  scale: number;
  tensors: { layer: number; projection: Projection; a: Float32Array; b: Float32Array }[];
}

/**
 * Writes a PEFT adapter directory: `lora`'s settings, and A/B tensors named as PEFT names them (F32, so a reload is
 * bit-identical). DifferentiableTransformer.saveAdapter writes its adapter through this.
 */
export function writeAdapter(dir: string, lora: LoraConfig, tensors: readonly { name: string; shape: number[]; data: Float32Array }[], baseModel = ""): void {
  fs.mkdirSync(dir, { recursive: true });
  const config = {
    peft_type: "LORA", task_type: "CAUSAL_LM", base_model_name_or_path: baseModel,
    r: lora.rank, lora_alpha: lora.alpha, use_rslora: lora.useRslora,
    target_modules: [...lora.targetModules], lora_dropout: 0, bias: "none", fan_in_fan_out: false,
    inference_mode: true, init_lora_weights: true, modules_to_save: null, use_dora: false,
    rank_pattern: {}, alpha_pattern: {}, layers_to_transform: null,
  };
  fs.writeFileSync(path.join(dir, ADAPTER_CONFIG_FILE), JSON.stringify(config, null, 2) + "\n");
  const written: Record<string, TensorToWrite> = {};
  for (const { name, shape, data } of tensors) written[name] = { dtype: "F32", shape, data };
  writeSafetensors(path.join(dir, ADAPTER_WEIGHTS_FILE), written, { format: "pt" });
}

/** Reads and checks a PEFT LoRA adapter directory against the model it is meant for. */
export function readAdapter(dir: string, config: ModelConfig): Adapter {
  const configFile = path.join(dir, ADAPTER_CONFIG_FILE);
  if (!fs.existsSync(configFile)) {
    throw new ArtError("not_found", `${configFile}: missing; a PEFT adapter directory has adapter_config.json and adapter_model.safetensors`);
  }
  let json: Record<string, unknown>;
  try {
    json = JSON.parse(fs.readFileSync(configFile, "utf8"));
  } catch (error) {
    throw new ArtError("bad_adapter", `${configFile}: not valid JSON (${(error as Error).message})`);
  }
  const refuse = (what: string) => {
    throw new ArtError("unsupported_adapter", `${configFile}: ${what} is not supported; art-ts loads plain LoRA adapters`);
  };
  if ((json.peft_type ?? "LORA") !== "LORA") refuse(`peft_type ${JSON.stringify(json.peft_type)}`);
  if (json.use_dora === true) refuse("use_dora (DoRA)");
  if (json.bias !== undefined && json.bias !== "none") refuse(`bias ${JSON.stringify(json.bias)}`);
  if (Array.isArray(json.modules_to_save) && json.modules_to_save.length > 0) refuse("modules_to_save");
  for (const key of ["rank_pattern", "alpha_pattern"]) {
    const pattern = json[key];
    if (pattern && typeof pattern === "object" && Object.keys(pattern).length > 0) refuse(`${key} (per-module rank/alpha)`);
  }
  const rank = json.r;
  const alpha = json.lora_alpha;
  if (typeof rank !== "number" || !Number.isInteger(rank) || rank < 1) throw new ArtError("bad_adapter", `${configFile}: "r" must be a positive integer, got ${JSON.stringify(rank)}`);
  if (typeof alpha !== "number" || !(alpha > 0)) throw new ArtError("bad_adapter", `${configFile}: "lora_alpha" must be a positive number, got ${JSON.stringify(alpha)}`);

  const weightsFile = path.join(dir, ADAPTER_WEIGHTS_FILE);
  const store = openSafetensors(weightsFile);
  try {
    const found = new Map<string, { a?: Float32Array; b?: Float32Array; layer: number; projection: Projection }>();
    const keyPattern = /^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$/;
    for (const name of store.names()) {
      const match = keyPattern.exec(name);
      const projection = match?.[3] as Projection | undefined;
      if (!match || !projection || !PROJECTIONS.includes(projection)) {
        throw new ArtError("unsupported_adapter", `${weightsFile}: tensor "${name}" is not a LoRA A/B of q/k/v/o/gate/up/down_proj`);
      }
      const layer = Number(match[1]);
      if (layer >= config.numLayers) {
        throw new ArtError("adapter_mismatch", `${weightsFile}: "${name}" is for layer ${layer}, but the model has ${config.numLayers} layers; this adapter belongs to another model`);
      }
      const { inFeatures, outFeatures } = projectionShape(config, projection);
      const isA = match[4] === "A";
      const expected = isA ? [rank, inFeatures] : [outFeatures, rank];
      const shape = store.info(name)!.shape;
      if (shape.length !== 2 || shape[0] !== expected[0] || shape[1] !== expected[1]) {
        throw new ArtError(
          "adapter_mismatch",
          `${weightsFile}: "${name}" has shape [${shape}] but this model (r=${rank}) needs [${expected}]; the adapter was trained for another model or rank`,
        );
      }
      const key = `${layer}.${projection}`;
      const entry = found.get(key) ?? { layer, projection };
      entry[isA ? "a" : "b"] = store.readF32(name);
      found.set(key, entry);
    }
    const tensors: Adapter["tensors"] = [];
    for (const entry of found.values()) {
      if (!entry.a || !entry.b) {
        throw new ArtError("bad_adapter", `${weightsFile}: ${projectionPath(entry.layer, entry.projection)} has lora_${entry.a ? "A" : "B"} but not lora_${entry.a ? "B" : "A"}`);
      }
      tensors.push({ layer: entry.layer, projection: entry.projection, a: entry.a, b: entry.b });
    }
    if (tensors.length === 0) throw new ArtError("bad_adapter", `${weightsFile}: no LoRA tensors`);
    const targetModules = PROJECTIONS.filter((p) => tensors.some((t) => t.projection === p));
    const lora: LoraConfig = { rank, alpha, targetModules, useRslora: json.use_rslora === true };
    return { lora, scale: loraScale(lora), tensors };
  } finally {
    store.close();
  }
}

/**
 * The adapter as per-layer engine LoRAs on the model's backend, for inference: what `loadCausalLM(path, { adapter })`
 * passes to every Transformer.forward. The caller owns the uploaded tensors.
 */
export function loadAdapter(dir: string, model: Pick<Transformer, "config" | "backend">): LayerLoras[] {
  const { config, backend } = model;
  const adapter = readAdapter(dir, config);
  const layers: LayerLoras[] = Array.from({ length: config.numLayers }, () => ({}));
  for (const t of adapter.tensors) {
    const { inFeatures, outFeatures } = projectionShape(config, t.projection);
    layers[t.layer][t.projection] = {
      a: backend.upload(t.a, [adapter.lora.rank, inFeatures]),
      b: backend.upload(t.b, [outFeatures, adapter.lora.rank]),
      scale: adapter.scale,
    };
  }
  return layers;
}
