package peers;

import org.apache.pulsar.client.api.Schema;
import peers.proto.Tickets.Ticket;

/** The schemas of the schema peers, by FORMAT (json, avro, protobuf), and their values. */
final class PulsarSchemas {
    private PulsarSchemas() {}

    static Schema<?> of(String format) {
        switch (format) {
            case "json":
                return Schema.JSON(SchemaOrder.class);
            case "avro":
                return Schema.AVRO(SchemaOrder.class);
            case "protobuf":
                return Schema.PROTOBUF(Ticket.class);
            default:
                throw new IllegalArgumentException("unknown format " + format + ": json, avro or protobuf");
        }
    }

    /** Value i of FORMAT. */
    static Object value(String format, int i) {
        if (format.equals("protobuf")) {
            return Ticket.newBuilder().setId(i).setSeat(i + "A").setPrice(i / 4.0).build();
        }
        return SchemaOrder.numbered(i);
    }

    /** The line printed for a received value. */
    static String line(Object value) {
        if (value instanceof Ticket) {
            Ticket ticket = (Ticket) value;
            return "id=" + ticket.getId() + " seat=" + ticket.getSeat() + " price=" + ticket.getPrice();
        }
        return ((SchemaOrder) value).line();
    }

    static String hex(byte[] bytes) {
        if (bytes == null) {
            return "none";
        }
        StringBuilder out = new StringBuilder();
        for (byte b : bytes) {
            out.append(String.format("%02x", b));
        }
        return out.toString();
    }
}
