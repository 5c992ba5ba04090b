package peers;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.producer.TransactionResolution;

/**
 * The official RocketMQ 5 Java client's transactional producer: sends one message with body
 * BODY to TOPIC in a transaction, then ENDS it: "commit", "rollback", or "orphan" (exits at
 * once with status 0 without ending it, as a producer killed before its commit). Its checker
 * answers ROLLBACK (it is asked only while it runs).
 * Usage: RocketMqTransaction ENDPOINT TOPIC BODY END
 * Prints "sent=MESSAGE_ID" then "ended=END".
 */
public final class RocketMqTransaction {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String topic = args[1];
        String body = args[2];
        String end = args[3];
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(10))
                .enableSsl(false)
                .build();
        var producer = provider.newProducerBuilder()
                .setClientConfiguration(config)
                .setTopics(topic)
                .setTransactionChecker(message -> {
                    System.out.println("checked=" + message.getMessageId());
                    System.out.flush();
                    return TransactionResolution.ROLLBACK;
                })
                .build();
        var transaction = producer.beginTransaction();
        var message = provider.newMessageBuilder()
                .setTopic(topic)
                .setKeys(body)
                .setBody(body.getBytes(StandardCharsets.UTF_8))
                .build();
        var receipt = producer.send(message, transaction);
        System.out.println("sent=" + receipt.getMessageId());
        System.out.flush();
        switch (end) {
            case "commit" -> transaction.commit();
            case "rollback" -> transaction.rollback();
            case "wait" -> {
                Thread.sleep(40_000);
                System.out.println("ended=wait");
                System.out.flush();
                Runtime.getRuntime().halt(0);
            }
            case "orphan" -> {
                System.out.println("ended=orphan");
                System.out.flush();
                Runtime.getRuntime().halt(0);
            }
            default -> throw new IllegalArgumentException("END is commit, rollback or orphan: " + end);
        }
        System.out.println("ended=" + end);
        System.out.flush();
        producer.close();
        System.exit(0);
    }
}
