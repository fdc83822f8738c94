"""The Django arms' two models: the same shape as the SQLAlchemy ones, the key from a
BigAutoField (Django's baseline) or from leafpool (``LeafpoolIdField``)."""

from django.db import models

from leafpool.orm.django import LeafpoolIdField

TAG = "bench2"


class Order(models.Model):
    """Every column but the key: an order as a payment system stores one."""

    customer_id = models.BigIntegerField()
    ref = models.CharField(max_length=32)
    amount_cents = models.BigIntegerField()
    currency = models.CharField(max_length=3)
    status = models.CharField(max_length=16)
    note = models.CharField(max_length=64)
    created_at = models.DateTimeField()

    class Meta:
        abstract = True
        app_label = "orm_bench"


class AutoRow(Order):
    id = models.BigAutoField(primary_key=True)

    class Meta:
        app_label = "orm_bench"
        db_table = "orm_dj_auto"


class LeafpoolRow(Order):
    id = LeafpoolIdField(tag=TAG, primary_key=True)

    class Meta:
        app_label = "orm_bench"
        db_table = "orm_dj_leafpool"
