package peers;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.MessageIdAdv;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * Subscribes to TOPIC as SUBSCRIPTION (Exclusive, from the earliest), receives and acknowledges
 * TOTAL messages, seeks, then prints the ids received after the seek until nothing comes for
 * 2 s, one per line as PARTITION:LEDGER:ENTRY:BATCH_INDEX (-1 outside a batch or a partition).
 * Usage: PulsarSeek SERVICE_URL TOPIC SUBSCRIPTION TOTAL TARGET
 *   TARGET: earliest, latest, time:MILLIS (a publish time), or id:PARTITION:LEDGER:ENTRY:BATCH_INDEX
 *   (the id of one of the messages received, which the seek is given as the client made it)
 * Prints: the ids, then after=N
 */
public final class PulsarSeek {
    static String show(MessageId id) {
        MessageIdAdv adv = (MessageIdAdv) id;
        return adv.getPartitionIndex() + ":" + adv.getLedgerId() + ":" + adv.getEntryId() + ":"
                + adv.getBatchIndex();
    }

    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int total = Integer.parseInt(args[3]);
        String target = args[4];
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             Consumer<byte[]> consumer = client.newConsumer(Schema.BYTES)
                     .topic(topic)
                     .subscriptionName(subscription)
                     .subscriptionType(SubscriptionType.Exclusive)
                     .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                     .subscribe()) {
            List<Message<byte[]>> received = new ArrayList<>();
            for (int i = 0; i < total; i++) {
                Message<byte[]> message = consumer.receive(30, TimeUnit.SECONDS);
                if (message == null) {
                    throw new IllegalStateException("only " + i + " of " + total + " arrived");
                }
                consumer.acknowledge(message);
                received.add(message);
            }
            if (target.equals("earliest")) {
                consumer.seek(MessageId.earliest);
            } else if (target.equals("latest")) {
                consumer.seek(MessageId.latest);
            } else if (target.startsWith("time:")) {
                consumer.seek(Long.parseLong(target.substring(5)));
            } else if (target.startsWith("id:")) {
                String wanted = target.substring(3);
                MessageId id = received.stream()
                        .map(Message::getMessageId)
                        .filter(m -> show(m).equals(wanted))
                        .findFirst()
                        .orElseThrow(() -> new IllegalArgumentException("no message " + wanted));
                consumer.seek(id);
            } else {
                throw new IllegalArgumentException("unknown target " + target);
            }
            int after = 0;
            while (true) {
                Message<byte[]> message = consumer.receive(2, TimeUnit.SECONDS);
                if (message == null) {
                    break;
                }
                consumer.acknowledge(message);
                System.out.println(show(message.getMessageId()));
                after++;
            }
            System.out.println("after=" + after);
        }
    }
}
