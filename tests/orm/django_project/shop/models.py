"""Models using leafpool IDs: as the primary key (``Order``: the default manager;
``Ticket``: string IDs and the user's own QuerySet through ``as_manager``), as an
ordinary field (``Invoice``: the user's own manager, used in migrations) and both at once
(``Parcel``: an explicit ``LeafpoolManager``)."""

from django.db import models

from leafpool.orm.django import LeafpoolIdField, LeafpoolManager


class Order(models.Model):
    id = LeafpoolIdField(tag="order", primary_key=True)
    customer = models.CharField(max_length=100)
    amount = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"order {self.pk} of {self.customer}"


class TicketQuerySet(models.QuerySet):
    def open(self) -> "TicketQuerySet":
        return self.filter(closed=False)


class Ticket(models.Model):
    """String IDs, for JSON read by JavaScript."""

    id = LeafpoolIdField(tag="ticket", primary_key=True, as_string=True)
    title = models.CharField(max_length=100)
    closed = models.BooleanField(default=False)

    objects = TicketQuerySet.as_manager()

    def __str__(self) -> str:
        return f"ticket {self.pk}: {self.title}"


class InvoiceQuerySet(models.QuerySet):
    def unpaid(self) -> "InvoiceQuerySet":
        return self.filter(paid=False)


class InvoiceManager(models.Manager.from_queryset(InvoiceQuerySet)):  # type: ignore[misc]
    use_in_migrations = True

    def issue(self, note: str) -> "Invoice":
        return self.create(note=note)


class Invoice(models.Model):
    """A leafpool ID beside Django's own auto-incremented key."""

    number = LeafpoolIdField(tag="invoice", unique=True)
    note = models.CharField(max_length=100, blank=True)
    paid = models.BooleanField(default=False)

    objects = InvoiceManager()

    def __str__(self) -> str:
        return f"invoice {self.number}"


class Parcel(models.Model):
    id = LeafpoolIdField(tag="parcel", primary_key=True)
    tracking = LeafpoolIdField(tag="tracking", unique=True, as_string=True)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="parcels")

    objects = LeafpoolManager()
