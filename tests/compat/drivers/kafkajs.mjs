// kafkajs (pure JavaScript) through the matrix scenario.
import { Kafka, logLevel } from 'kafkajs';
import { Result, args, kafkaJsScenario, packageVersion } from './common.mjs';

const a = args();
const res = new Result(await packageVersion('kafkajs'));
const kafka = new Kafka({ clientId: 'compat-kafkajs', brokers: [a.bootstrap],
  logLevel: logLevel.NOTHING });
await kafkaJsScenario(a, res, {
  kafka,
  admin: kafka.admin(),
  consumer: kafka.consumer({ groupId: a.group, sessionTimeout: a.sessionTimeoutMs,
    heartbeatInterval: 1000 }),
  createOptions: { waitForLeaders: true },
  subscription: { topic: a.topic, fromBeginning: true },
  runOptions: { autoCommit: false },
});
