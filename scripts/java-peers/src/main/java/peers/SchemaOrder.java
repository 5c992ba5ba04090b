package peers;

/**
 * The value of the JSONSchema and AvroSchema peers: public fields, so that Jackson and Avro's
 * reflection see the same three (id, item, price; item may be null).
 */
public final class SchemaOrder {
    public long id;
    public String item;
    public double price;

    public SchemaOrder() {}

    /** Order i: item "item-i" for even i, null for odd i; price i / 4. */
    public static SchemaOrder numbered(int i) {
        SchemaOrder order = new SchemaOrder();
        order.id = i;
        order.item = i % 2 == 0 ? "item-" + i : null;
        order.price = i / 4.0;
        return order;
    }

    /** The line the peers print for a value. */
    public String line() {
        return "id=" + id + " item=" + (item == null ? "null" : item) + " price=" + price;
    }
}
