// @confluentinc/kafka-javascript (librdkafka, through its KafkaJS-style API).
import ckjs from '@confluentinc/kafka-javascript';
import { Result, args, kafkaJsScenario, packageVersion } from './common.mjs';

const { Kafka, logLevel } = ckjs.KafkaJS;
const a = args();
const res = new Result(`${await packageVersion('@confluentinc/kafka-javascript')} `
  + `(librdkafka ${ckjs.librdkafkaVersion})`);
const kafka = new Kafka({ kafkaJS: { brokers: [a.bootstrap], logLevel: logLevel.NOTHING } });
await kafkaJsScenario(a, res, {
  kafka,
  admin: kafka.admin(),
  consumer: kafka.consumer({ kafkaJS: { groupId: a.group, fromBeginning: true,
    autoCommit: false, sessionTimeout: a.sessionTimeoutMs } }),
  subscription: { topics: [a.topic] },
});
