// @platformatic/kafka (pure JavaScript, Node 22+) through the matrix scenario.
import { Admin, Consumer, Producer, stringDeserializers, stringSerializers }
  from '@platformatic/kafka';
import { Result, args, checkValues, packageVersion, until } from './common.mjs';

const a = args();
const res = new Result(await packageVersion('@platformatic/kafka'));
const base = { clientId: 'compat-platformatic', bootstrapBrokers: [a.bootstrap] };
const admin = new Admin(base);
const consumer = new Consumer({ ...base, groupId: a.group, deserializers: stringDeserializers,
  sessionTimeout: a.sessionTimeoutMs, heartbeatInterval: 1000 });
const values = [];
const last = new Map(); // partition -> last message seen
let stream;

try {
  if (await res.step('admin', async () => {
    await admin.createTopics({ topics: [a.topic], partitions: a.partitions, replicas: 1 });
  }) && await res.step('produce', async () => {
    const producer = new Producer({ ...base, serializers: stringSerializers });
    for (let i = 0; i < a.messages; i += 500) {
      const messages = [];
      for (let j = i; j < Math.min(i + 500, a.messages); j++) {
        messages.push({ topic: a.topic, key: `k${j}`, value: String(j) });
      }
      await producer.send({ messages });
    }
    await producer.close();
  }) && await res.step('consume', async () => {
    stream = await consumer.consume({ topics: [a.topic], mode: 'earliest', autocommit: false,
      sessionTimeout: a.sessionTimeoutMs, heartbeatInterval: 1000 });
    stream.on('data', (m) => { values.push(Number(m.value)); last.set(m.partition, m); });
    await until(() => values.length >= a.messages, a.deadline);
    return checkValues(values, a.messages);
  })) {
    await res.step('commit', async () => {
      for (const m of last.values()) await m.commit();
      const [group] = await admin.listConsumerGroupOffsets({ groups: [a.group] });
      let total = 0;
      for (const t of group.topics) {
        for (const p of t.partitions) total += Math.max(Number(p.committedOffset), 0);
      }
      return total === a.messages ? 'ok' : `fail: committed offsets sum to ${total}`;
    });
    await res.step('groups', async () => {
      const listed = (await admin.listGroups()).has(a.group);
      const d = (await admin.describeGroups({ groups: [a.group] })).get(a.group);
      if (!listed || !d) return `fail: listed=${listed} described=${Boolean(d)}`;
      return d.members.size ? 'ok' : `ok: the backend describes it with no members (${d.state})`;
    });
  }
} finally {
  if (stream) await stream.close().catch(() => {});
  await consumer.close().catch(() => {});
  await admin.close().catch(() => {});
}
res.emit();
