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

// An optional feature's cells holding one of the training CSV's missing-value markers as the gap of its dtype
// (preprocessing.py's _marked_missing).
function markedMissing(values, feature, markers) {
  if (!markers.length || !feature.optional) return values;
  if (feature.dtype === 'string') return values.map((v) => (markers.includes(v.trim()) ? '' : v));
  const numbers = markers.map(Number).filter((n) => !Number.isNaN(n)
    && (feature.dtype !== 'int' || Number.isInteger(n)));
  const gap = feature.dtype === 'float' ? NaN : -1;
  return values.map((v) => (numbers.includes(v) ? gap : v));
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

// The digits a field may have and the days of each month (preprocessing.py's FIELD_DIGITS and MONTH_DAYS).
const FIELD_DIGITS = { year: [4, 4], month: [1, 2], day: [1, 2], hour: [1, 2] };
const MONTH_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
const SECONDS_PER_DAY = 86400;
const floorDiv = (a, b) => Math.floor(a / b);
// Python's and TensorFlow's %: the remainder takes the sign of the divisor (days before 1970 are negative).
const floorMod = (a, b) => ((a % b) + b) % b;

// Days since 1970-01-01 (Howard Hinnant's days_from_civil, as transform.civil_days).
function civilDays(year, month, day) {
  const y = year - (month <= 2 ? 1 : 0);
  const era = floorDiv(y, 400);
  const yearOfEra = y - era * 400;
  const dayOfYear = floorDiv(153 * ((month + 9) % 12) + 2, 5) + day - 1;
  return era * 146097 + yearOfEra * 365 + floorDiv(yearOfEra, 4) - floorDiv(yearOfEra, 100) + dayOfYear - 719468;
}

function civilFromDays(days) {
  const z = days + 719468;
  const era = floorDiv(z, 146097);
  const dayOfEra = z - era * 146097;
  const yearOfEra = floorDiv(dayOfEra - floorDiv(dayOfEra, 1460) + floorDiv(dayOfEra, 36524) -
    floorDiv(dayOfEra, 146096), 365);
  const dayOfYear = dayOfEra - (365 * yearOfEra + floorDiv(yearOfEra, 4) - floorDiv(yearOfEra, 100));
  const shiftedMonth = floorDiv(5 * dayOfYear + 2, 153);
  const month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9;
  return [yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month];
}

// [year, month, day of week (Monday 0), hour] of one cell, or null when missing, and whether the hour is present.
function datetimeValue(value, fields) {
  if (fields.length === 1 && fields[0] === 'epoch') {
    if (value < 0) return [null, false];
    const seconds = value % SECONDS_PER_DAY;
    const days = (value - seconds) / SECONDS_PER_DAY;
    const [year, month] = civilFromDays(days);
    return [[year, month, (days + 3) % 7, floorDiv(seconds, 3600)], true];
  }
  const groups = value.replace(/[^0-9]+/g, ' ').trim().split(' ');
  const parsed = {};
  fields.forEach((name, i) => {
    if (!(name in FIELD_DIGITS)) return;
    const group = groups[i] ?? '';
    const [fewest, most] = FIELD_DIGITS[name];
    parsed[name] = group.length >= fewest && group.length <= most ? Number.parseInt(group, 10) : null;
  });
  const { year, month, day } = parsed;
  if (year === null || month === null || day === null || month < 1 || month > 12) return [null, false];
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  if (day < 1 || day > MONTH_DAYS[month - 1] + (leap && month === 2 ? 1 : 0)) return [null, false];
  const hour = parsed.hour ?? null;
  const hourPresent = hour !== null && hour <= 23;
  return [[year, month, floorMod(civilDays(year, month, day) + 3, 7), hourPresent ? hour : 0], hourPresent];
}

// A date feature's <name>_year (z-scored like a numeric feature) and the ids of its month, day of week and hour.
function datetimeOutputs(values, feature, suffix) {
  const cells = values.map((v) => datetimeValue(v, feature.fields));
  const { fill, mean, std } = feature.parts.year;
  const m = Math.fround(mean);
  const s = Math.fround(std);
  const outputs = {
    [`${feature.name}_year${suffix}`]: Float32Array.from(cells, ([date]) => {
      const year = date ? Math.fround(date[0]) : Math.fround(fill);
      return s > 0 ? Math.fround(Math.fround(year - m) / s) : Math.fround(year - m);
    }),
  };
  const index = { month: 1, day_of_week: 2, hour: 3 };
  for (const [part, settings] of Object.entries(feature.parts)) {
    if (part === 'year') continue;
    outputs[`${feature.name}_${part}${suffix}`] = Int32Array.from(cells, ([date, hasHour]) => {
      if (!date || (part === 'hour' && !hasHour)) return settings.missing_id;
      return date[index[part]] - (part === 'month' ? 1 : 0);
    });
  }
  return outputs;
}

// Returns {'<name>_xf': {values: Float32Array | Int32Array, shape: [rows, 1], dtype}} for every feature.
export function preprocess(spec, columns) {
  const outputs = {};
  let rows = null;
  for (const feature of spec.features) {
    const values = markedMissing(column(columns, feature), feature, spec.missing_values || []);
    if (rows !== null && values.length !== rows) {
      throw new RequestError(`feature '${feature.name}' has ${values.length} values, others ${rows}; ` +
        'send one value per row for every feature.');
    }
    rows = values.length;
    if (feature.kind === 'datetime') {
      for (const [name, out] of Object.entries(datetimeOutputs(values, feature, spec.output_suffix))) {
        outputs[name] = { values: out, shape: [rows, 1], dtype: out instanceof Float32Array ? 'float32' : 'int32' };
      }
      continue;
    }
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
