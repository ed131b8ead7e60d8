// A read_committed dump of whole topics for dev/cdc-vs-debezium.sh: every record of the named
// topics up to their last stable offset, one JSON line each, key, value and headers base64
// (orderpipe's values are Avro, Debezium's JSON: the reader decodes both). Kafka's own Java
// client, run from source on the dev stack's class path:
//   java -cp '.stack/lib/kafka/*' dev/debezium/TopicDump.java BOOTSTRAP TOPIC...
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class TopicDump {
    public static void main(String[] args) {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("isolation.level", "read_committed");
        p.put("enable.auto.commit", "false");
        p.put("fetch.max.wait.ms", "50");
        Base64.Encoder b64 = Base64.getEncoder();
        try (KafkaConsumer<byte[], byte[]> c =
                new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> parts = new ArrayList<>();
            for (String t : Arrays.copyOfRange(args, 1, args.length)) {
                var infos = c.partitionsFor(t, Duration.ofSeconds(30));
                if (infos == null) continue;
                infos.forEach(i -> parts.add(new TopicPartition(t, i.partition())));
            }
            c.assign(parts);
            c.seekToBeginning(parts);
            // Read committed: the end offsets are the last stable offsets, so no open transaction's
            // records are waited for.
            Map<TopicPartition, Long> end = c.endOffsets(parts);
            StringBuilder out = new StringBuilder();
            while (parts.stream().anyMatch(tp -> c.position(tp) < end.get(tp))) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    out.setLength(0);
                    out.append("{\"topic\":\"").append(r.topic()).append("\",\"partition\":").append(r.partition())
                        .append(",\"offset\":").append(r.offset())
                        .append(",\"key\":").append(r.key() == null ? "null" : "\"" + b64.encodeToString(r.key()) + "\"")
                        .append(",\"value\":").append(r.value() == null ? "null" : "\"" + b64.encodeToString(r.value()) + "\"")
                        .append(",\"headers\":{");
                    String sep = "";
                    for (Header h : r.headers()) {
                        out.append(sep).append('"').append(h.key()).append("\":\"")
                            .append(h.value() == null ? "" : b64.encodeToString(h.value())).append('"');
                        sep = ",";
                    }
                    System.out.println(out.append("}}"));
                }
            }
        }
    }
}
