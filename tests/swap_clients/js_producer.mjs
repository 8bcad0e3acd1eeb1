// A producer that sends 0, 1, 2, ... every few milliseconds and logs each delivery:
// the Node.js counterpart of py_producer.py, with the same arguments and output
// (one JSON line per delivery report: {"s": seq, "t": wall-clock seconds, "e": error}).
// The clients come from tests/js/node_modules (`make test-js` installs them).
import { createRequire } from 'node:module'
import { existsSync, openSync, readFileSync, writeSync, closeSync } from 'node:fs'
import { parseArgs } from 'node:util'

// @platformatic/kafka asks for Node.js 22 (Debian ships 20); the one newer built-in it
// calls is Promise.withResolvers, so it is supplied here when missing.
Promise.withResolvers ??= function () {
  let resolve, reject
  const promise = new Promise((res, rej) => { resolve = res; reject = rej })
  return { promise, resolve, reject }
}

const require = createRequire(new URL('../js/package.json', import.meta.url))
const { values: args } = parseArgs({
  options: {
    client: { type: 'string' },
    bootstrap: { type: 'string' },
    topic: { type: 'string' },
    'client-id': { type: 'string' },
    out: { type: 'string' },
    stop: { type: 'string' },
    interval: { type: 'string', default: '0.01' },
    'metadata-max-age-ms': { type: 'string' }
  }
})
const FLUSH_MS = 45000
// Sends not yet acknowledged, at most: the application waits beyond this, as a real one
// bounds its backlog. (@platformatic/kafka 2.12.1 also overflows its stack failing a
// backlog of thousands of queued requests at once when a connection closes.)
const MAX_PENDING = 200
const interval = Number(args.interval) * 1000
const metadataMaxAge = args['metadata-max-age-ms'] ? Number(args['metadata-max-age-ms']) : undefined
const out = openSync(args.out, 'w')
let reported = 0
const write = (record) => writeSync(out, JSON.stringify(record) + '\n')
const delivery = (seq, err) => {
  reported += 1
  write({ s: seq, t: Date.now() / 1000, e: err ? String(err.message || err) : null })
}
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

// Generous retries: the test asks for zero failed deliveries; the stall is measured.
const clients = {
  async '@platformatic/kafka' () {
    const { Producer, ProduceAcks, stringSerializers } = await import(
      require.resolve('@platformatic/kafka'))
    // The package's exports leave out its package.json: read it from disk.
    const manifest = new URL('../js/node_modules/@platformatic/kafka/package.json', import.meta.url)
    const { version } = JSON.parse(readFileSync(manifest, 'utf8'))
    write({ client: '@platformatic/kafka', version })
    const producer = new Producer({
      clientId: args['client-id'],
      bootstrapBrokers: [args.bootstrap],
      serializers: stringSerializers,
      idempotent: false,
      acks: ProduceAcks.ALL,
      retries: 60,
      retryDelay: 250,
      ...(metadataMaxAge ? { metadataMaxAge } : {})
    })
    return [
      (seq) => producer.send({ messages: [{ topic: args.topic, value: String(seq) }] }),
      () => producer.close()
    ]
  },
  async kafkajs () {
    const { Kafka, logLevel } = require('kafkajs')
    write({ client: 'kafkajs', version: require('kafkajs/package.json').version })
    const kafka = new Kafka({
      clientId: args['client-id'],
      brokers: [args.bootstrap],
      logLevel: logLevel.NOTHING,
      retry: { retries: 30, initialRetryTime: 100, maxRetryTime: 1000 }
    })
    const producer = kafka.producer({
      idempotent: false, allowAutoTopicCreation: false, ...(metadataMaxAge ? { metadataMaxAge } : {})
    })
    await producer.connect()
    return [
      (seq) => producer.send({ topic: args.topic, acks: -1, messages: [{ value: String(seq) }] }),
      () => producer.disconnect()
    ]
  }
}

const [send, close] = await clients[args.client]()
const pending = new Set()
const start = performance.now()
let seq = 0
while (!existsSync(args.stop)) {
  const delay = start + seq * interval - performance.now()
  if (delay > 0) await sleep(delay)
  while (pending.size >= MAX_PENDING) await Promise.race(pending)
  const s = seq
  const p = send(s).then(() => delivery(s, null), (err) => delivery(s, err))
  pending.add(p)
  p.finally(() => pending.delete(p))
  seq += 1
}
await Promise.race([Promise.allSettled([...pending]), sleep(FLUSH_MS)])
await Promise.race([close(), sleep(5000)])
write({ sent: seq, reported })
closeSync(out)
process.exit(0)
