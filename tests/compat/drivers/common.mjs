// What the Node drivers share: arguments, steps in order, one JSON result line, and the
// scenario through a KafkaJS-style API.
export function args() {
  const a = { messages: 2000, partitions: 3, sessionTimeoutMs: 6000, deadline: 120 };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    a[key] = ['messages', 'partitions', 'sessionTimeoutMs', 'deadline'].includes(key)
      ? Number(argv[i + 1]) : argv[i + 1];
  }
  return a;
}

export class Result {
  constructor(version) { this.version = version; this.steps = {}; }
  async step(name, fn) {
    let outcome;
    try {
      outcome = (await fn()) ?? 'ok';
    } catch (e) {
      console.error(e);
      outcome = `fail: ${e && e.name}: ${e && e.message}`.slice(0, 300);
    }
    this.steps[name] = outcome;
    return !outcome.startsWith('fail');
  }
  emit() { console.log(JSON.stringify({ version: this.version, steps: this.steps })); }
}

export function checkValues(values, expected) {
  const sorted = [...values].sort((x, y) => x - y);
  const ok = sorted.length === expected && sorted.every((v, i) => v === i);
  return ok ? 'ok'
    : `fail: ${values.length} received, ${new Set(values).size} distinct, ${expected} expected`;
}

export async function until(cond, seconds) {
  const end = Date.now() + seconds * 1000;
  while (!cond() && Date.now() < end) await new Promise((r) => setTimeout(r, 100));
  return cond();
}

export async function packageVersion(name) {
  const { readFile } = await import('node:fs/promises');
  const pkg = JSON.parse(await readFile(new URL(`./node_modules/${name}/package.json`,
    import.meta.url)));
  return pkg.version;
}

// The matrix scenario through a KafkaJS-style API (kafkajs, and the KafkaJS layer of
// @confluentinc/kafka-javascript). The drivers build the clients; they differ only in
// the extra options of createTopics, the subscription and the options of consumer.run.
export async function kafkaJsScenario(a, res, { kafka, admin, consumer, createOptions = {},
  subscription, runOptions = {} }) {
  const values = [];
  const next = new Map(); // partition -> next offset to commit
  try {
    await admin.connect();
    if (await res.step('admin', async () => {
      await admin.createTopics({ topics: [{ topic: a.topic, numPartitions: a.partitions }],
        ...createOptions });
    }) && await res.step('produce', async () => {
      const producer = kafka.producer();
      await producer.connect();
      for (let i = 0; i < a.messages; i += 500) {
        const messages = [];
        for (let j = i; j < Math.min(i + 500, a.messages); j++) {
          messages.push({ key: `k${j}`, value: String(j) });
        }
        await producer.send({ topic: a.topic, messages });
      }
      await producer.disconnect();
    }) && await res.step('consume', async () => {
      await consumer.connect();
      await consumer.subscribe(subscription);
      await consumer.run({ ...runOptions, eachMessage: async ({ partition, message }) => {
        values.push(Number(message.value.toString()));
        next.set(partition, BigInt(message.offset) + 1n);
      } });
      await until(() => values.length >= a.messages, a.deadline);
      return checkValues(values, a.messages);
    })) {
      await res.step('commit', async () => {
        await consumer.commitOffsets([...next].map(([partition, offset]) => (
          { topic: a.topic, partition, offset: String(offset) })));
        const [fetched] = await admin.fetchOffsets({ groupId: a.group, topics: [a.topic] });
        const total = fetched.partitions.reduce((s, p) => s + Math.max(Number(p.offset), 0), 0);
        return total === a.messages ? 'ok' : `fail: committed offsets sum to ${total}`;
      });
      await res.step('groups', async () => {
        const { groups } = await admin.listGroups();
        const { groups: described } = await admin.describeGroups([a.group]);
        const listed = groups.some((g) => g.groupId === a.group);
        const d = described[0];
        if (!listed || !d || d.groupId !== a.group) return `fail: listed=${listed}`;
        return d.members.length ? 'ok'
          : `ok: the backend describes it with no members (${d.state})`;
      });
    }
  } finally {
    await consumer.disconnect().catch(() => {});
    await admin.disconnect().catch(() => {});
  }
  res.emit();
}
