package peers;

import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageIdAdv;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Reader;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.impl.BatchMessageIdImpl;
import org.apache.pulsar.client.impl.MessageIdImpl;

/**
 * Reads TOPIC with the official Reader from START until nothing is available, and prints the
 * ids read in order, one per line as LEDGER:ENTRY:BATCH_INDEX (-1 outside a batch).
 * Usage: PulsarRead SERVICE_URL TOPIC START INCLUSIVE
 *   START: earliest, latest, or LEDGER:ENTRY:BATCH_INDEX:BATCH_SIZE (BATCH_INDEX -1 outside a batch)
 *   INCLUSIVE: true or false (startMessageIdInclusive)
 * Prints: the ids, then read=N
 */
public final class PulsarRead {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        MessageId start;
        if (args[2].equals("earliest")) {
            start = MessageId.earliest;
        } else if (args[2].equals("latest")) {
            start = MessageId.latest;
        } else {
            String[] parts = args[2].split(":");
            long ledger = Long.parseLong(parts[0]);
            long entry = Long.parseLong(parts[1]);
            int index = Integer.parseInt(parts[2]);
            int size = Integer.parseInt(parts[3]);
            start = index < 0 ? new MessageIdImpl(ledger, entry, -1)
                    : new BatchMessageIdImpl(ledger, entry, -1, index, size, null);
        }
        boolean inclusive = Boolean.parseBoolean(args[3]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            var builder = client.newReader(Schema.BYTES).topic(topic).startMessageId(start);
            if (inclusive) {
                builder = builder.startMessageIdInclusive();
            }
            try (Reader<byte[]> reader = builder.create()) {
                int read = 0;
                while (reader.hasMessageAvailable()) {
                    Message<byte[]> message = reader.readNext(10, TimeUnit.SECONDS);
                    if (message == null) {
                        break;
                    }
                    // A partitioned topic's reader gives TopicMessageIdImpl: read it through
                    // MessageIdAdv, which every id implements (batch index -1 outside a batch).
                    MessageIdAdv id = (MessageIdAdv) message.getMessageId();
                    System.out.println(id.getLedgerId() + ":" + id.getEntryId() + ":" + id.getBatchIndex());
                    read++;
                }
                System.out.println("read=" + read);
            }
        }
    }
}
