// The Transform step as data: JavaScript twin of components/exporter/preprocessing.py, shipped beside the TF.js
// model. It turns the raw request the SavedModel's serving_default takes (one array per feature; a missing value is
// null or NaN for floats, '' for strings, -1 for integers) into the transformed features the graph model takes,
// with float32 arithmetic that matches TensorFlow's bit for bit.

export class RequestError extends Error {}

function column(columns, feature) {
  const values = columns[feature.name];
  if (!Array.isArray(values)) {
    throw new RequestError(`the request lacks feature '${feature.name}'; send one value per row (${feature.dtype}).`);
  }
  return values.map((v) => {
    if (feature.dtype === 'string') return v === null || v === undefined ? '' : String(v);
    if (v === null || v === undefined) return feature.dtype === 'float' ? NaN : -1;
    if (typeof v !== 'number') {
      throw new RequestError(`feature '${feature.name}' must hold ${feature.dtype} values, got ${JSON.stringify(v)}.`);
    }
    return v;
  });
}

// float32 values and which are present, as the Transform graph sees them.
function asFloat(values, feature) {
  return values.map((v) => {
    const present = feature.dtype === 'int' ? !(feature.optional && v === -1) : !Number.isNaN(v);
    return [Math.fround(v), present];
  });
}

function asText(values, feature) {
  if (feature.dtype !== 'int') return values;
  return values.map((v) => (feature.optional && v === -1 ? '' : String(v)));
}

// Returns {'<name>_xf': {values: Float32Array | Int32Array, shape: [rows, 1], dtype}} for every feature.
export function preprocess(spec, columns) {
  const outputs = {};
  let rows = null;
  for (const feature of spec.features) {
    const values = column(columns, feature);
    if (rows !== null && values.length !== rows) {
      throw new RequestError(`feature '${feature.name}' has ${values.length} values, others ${rows}; ` +
        'send one value per row for every feature.');
    }
    rows = values.length;
    let out;
    if (feature.kind === 'numeric') {
      const mean = Math.fround(feature.mean);
      const std = Math.fround(feature.std);
      const fill = Math.fround(feature.fill);
      out = Float32Array.from(asFloat(values, feature), ([x, present]) => {
        const filled = present ? x : fill;
        return std > 0 ? Math.fround(Math.fround(filled - mean) / std) : Math.fround(filled - mean);
      });
    } else if (feature.kind === 'bucket') {
      const boundaries = feature.boundaries.map(Math.fround);
      out = Int32Array.from(asFloat(values, feature), ([x, present]) => {
        if (!present) return feature.missing_id;
        return boundaries.reduce((count, b) => count + (x >= b ? 1 : 0), 0);
      });
    } else if (feature.kind === 'category') {
      // -1 (missing), negative and larger values all get the one out-of-range id.
      out = Int32Array.from(values, (v) => (v >= 0 && v <= feature.max_id ? v : feature.oov_id));
    } else {
      const index = new Map(feature.vocabulary.map((token, i) => [token, i]));
      out = Int32Array.from(asText(values, feature), (token) => index.get(token) ?? feature.oov_id);
    }
    outputs[feature.name + spec.output_suffix] = {
      values: out, shape: [rows, 1], dtype: out instanceof Float32Array ? 'float32' : 'int32',
    };
  }
  return outputs;
}

// What the SavedModel's serving_default answers, from the graph model's output (a flat array of `rows` rows):
// {probabilities} for a binary model, {probabilities: [[per class]], class: [name], classes: [[names]]} for a
// multiclass one (the class names are the spec's task.classes), {value} for a regression model.
export function postprocess(spec, values, rows) {
  const task = spec.task ?? { kind: 'binary', output: 'probabilities' };
  if (task.kind !== 'multiclass') return { [task.output]: Array.from(values) };
  const width = task.classes.length;
  const probabilities = [];
  const predicted = [];
  for (let r = 0; r < rows; r++) {
    const row = Array.from(values.slice(r * width, (r + 1) * width));
    let best = 0;
    for (let c = 1; c < width; c++) if (row[c] > row[best]) best = c;
    probabilities.push(row);
    predicted.push(task.classes[best]);
  }
  return { [task.output]: probabilities, class: predicted, classes: predicted.map(() => [...task.classes]) };
}
