// Debezium 3.5 calls org.apache.kafka.common.utils.Sanitizer, which Kafka 4.4
// moved to ...utils.internals. This shim (compiled by dev/bench-cdc.sh onto the
// Connect worker's class path, benchmark peer only) forwards to the new place.
package org.apache.kafka.common.utils;

public final class Sanitizer {
    private Sanitizer() {}

    public static String sanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.sanitize(name);
    }

    public static String desanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.desanitize(name);
    }

    public static String jmxSanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.jmxSanitize(name);
    }
}
