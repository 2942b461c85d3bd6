// Runs the TF.js graph model on raw rows in Node.js with @tensorflow/tfjs (pure JavaScript CPU backend).
//   node predict.mjs <tfjs model dir> <request.json> [<output.json>] [<timed rows>]
// request.json: {"feature": [value per row], ...}, the same request the SavedModel takes. Writes (or prints) what
// the SavedModel answers ({"probabilities": [...]} for a binary model, with "class" and "classes" for a multiclass
// one, {"value": [...]} for a regression one) and "latency_ms": the time of each of the first <timed rows> rows
// sent alone (preprocessing included).
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as tf from '@tensorflow/tfjs';
import { postprocess, preprocess } from './preprocessing.mjs';

export async function loadModel(dir) {
  const modelJson = JSON.parse(readFileSync(join(dir, 'model.json'), 'utf8'));
  const weightSpecs = modelJson.weightsManifest.flatMap((group) => group.weights);
  const buffers = modelJson.weightsManifest.flatMap((group) => group.paths.map((p) => readFileSync(join(dir, p))));
  const weightData = new Uint8Array(Buffer.concat(buffers)).buffer;
  return tf.loadGraphModel(tf.io.fromMemory({
    modelTopology: modelJson.modelTopology, weightSpecs, weightData,
    format: modelJson.format, generatedBy: modelJson.generatedBy, convertedBy: modelJson.convertedBy,
    signature: modelJson.signature, userDefinedMetadata: modelJson.userDefinedMetadata,
  }));
}

export function predict(model, spec, columns) {
  const features = preprocess(spec, columns);
  return tf.tidy(() => {
    const inputs = {};
    for (const input of model.inputs) {
      const key = input.name.replace(/:0$/, '');
      const feature = features[key];
      if (!feature) throw new Error(`the model takes input '${key}', which the preprocessing spec does not make.`);
      inputs[input.name] = tf.tensor(feature.values, feature.shape, feature.dtype);
    }
    return model.execute(inputs).reshape([-1]).dataSync();
  });
}

function rowsOf(columns) {
  const first = Object.values(columns)[0];
  return Array.isArray(first) ? first.length : 0;
}

async function main() {
  const [dir, requestPath, outputPath, timed = '0'] = process.argv.slice(2);
  if (!dir || !requestPath) {
    console.error('usage: node predict.mjs <tfjs model dir> <request.json> [<output.json>] [<timed rows>]');
    process.exit(2);
  }
  await tf.setBackend('cpu');
  const model = await loadModel(dir);
  const spec = JSON.parse(readFileSync(join(dir, 'preprocessing.json'), 'utf8'));
  const columns = JSON.parse(readFileSync(requestPath, 'utf8'));
  const rows = rowsOf(columns);
  const outputs = postprocess(spec, predict(model, spec, columns), rows);
  const latency = [];
  for (let i = 0; i < Math.min(Number(timed), rows); i++) {
    const one = Object.fromEntries(Object.entries(columns).map(([k, v]) => [k, [v[i]]]));
    const start = process.hrtime.bigint();
    predict(model, spec, one);
    latency.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  const result = JSON.stringify({ ...outputs, latency_ms: latency, backend: tf.getBackend() });
  if (outputPath) writeFileSync(outputPath, result); else console.log(result);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => { console.error(`TF.js prediction failed: ${e.message}`); process.exit(1); });
}
