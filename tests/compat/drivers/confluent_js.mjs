// @confluentinc/kafka-javascript (librdkafka, through its KafkaJS-style API).
import ckjs from '@confluentinc/kafka-javascript';
import { Result, args, checkValues, packageVersion, until } from './common.mjs';

const { Kafka, logLevel } = ckjs.KafkaJS;
const a = args();
const res = new Result(`${await packageVersion('@confluentinc/kafka-javascript')} `
  + `(librdkafka ${ckjs.librdkafkaVersion})`);
const kafka = new Kafka({ kafkaJS: { brokers: [a.bootstrap], logLevel: logLevel.NOTHING } });
const admin = kafka.admin();
const consumer = kafka.consumer({ kafkaJS: { groupId: a.group, fromBeginning: true,
  autoCommit: false, sessionTimeout: a.sessionTimeoutMs } });
const values = [];
const next = new Map(); // partition -> next offset to commit

try {
  await admin.connect();
  if (await res.step('admin', async () => {
    await admin.createTopics({ topics: [{ topic: a.topic, numPartitions: a.partitions }] });
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
    await consumer.subscribe({ topics: [a.topic] });
    await consumer.run({ eachMessage: async ({ partition, message }) => {
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
