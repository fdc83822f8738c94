"""LeafpoolIdField in a real project: save, bulk_create, string IDs, the empty-pool
policy, threads, fork, managers, settings and migrations. Pools are filled by hand in a
real Redis (shop/pools.py) and round trips are Redis's own count of LPOP commands."""

from __future__ import annotations

import json
import os
import threading
from unittest import mock

from asgiref.sync import async_to_sync
from django.core import checks, serializers
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction
from django.forms import modelform_factory
from django.test import TestCase, override_settings
from django.test.utils import CaptureQueriesContext

from leafpool.core.errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidTag,
    PoolEmpty,
    UnknownTag,
)
from leafpool.orm import django as lp
from leafpool.orm.batch import default_batches
from leafpool.orm.django import LeafpoolIdField, LeafpoolQuerySet, fill_ids, leafpool_settings
from shop import pools
from shop.models import Invoice, Order, Parcel, Ticket

BIG = 2**53  # JavaScript's numbers are exact below it only
REDIS_URL = os.environ.get("SHOP_REDIS_URL", "redis://127.0.0.1:6379/0")


def leafpool_setting(**extra: object) -> dict[str, object]:
    return {"REDIS_URL": REDIS_URL, "EMPTY_POLICY": "raise", **extra}


class PoolTestCase(TestCase):
    def setUp(self) -> None:
        pools.flush()


class SaveTests(PoolTestCase):
    def test_save_takes_the_next_id_and_is_one_insert(self) -> None:
        pools.fill("order", range(1, 11))
        order = Order(customer="ada")
        self.assertIsNone(order.pk)
        self.assertEqual(pools.left("order"), 10)  # creating an object takes no ID
        with CaptureQueriesContext(connection) as queries:
            order.save()
        self.assertEqual(order.pk, 1)
        sql = [q["sql"].lstrip().upper() for q in queries.captured_queries]
        self.assertEqual(len(sql), 1, sql)
        self.assertTrue(sql[0].startswith("INSERT"), sql)  # no UPDATE tried first
        second = Order.objects.create(customer="bob")
        self.assertEqual(second.pk, 2)
        self.assertEqual(Order.objects.get(pk=1).customer, "ada")
        order.amount = 5
        with CaptureQueriesContext(connection) as queries:
            order.save()  # saved again: an UPDATE, no ID taken
        self.assertEqual(order.pk, 1)
        self.assertTrue(queries.captured_queries[0]["sql"].lstrip().upper().startswith("UPDATE"))
        self.assertEqual(pools.left("order"), 8)

    def test_a_value_given_is_kept(self) -> None:
        pools.fill("order", range(1, 3))
        before = pools.lpop_calls()
        Order(id=777, customer="given").save()
        self.assertEqual(pools.lpop_calls(), before)
        self.assertEqual(Order.objects.get().pk, 777)
        # a new object with an existing row's key is inserted, as with UUID-default keys
        with self.assertRaises(IntegrityError), transaction.atomic():
            Order(id=777, customer="again").save()
        self.assertEqual(Order.objects.get().customer, "given")

    def test_an_ordinary_field_is_filled_on_insert(self) -> None:
        pools.fill("invoice", range(100, 110))
        invoice = Invoice(note="first")
        self.assertIsNone(invoice.number)
        invoice.save()
        self.assertEqual(invoice.number, 100)
        self.assertEqual(Invoice.objects.issue("second").number, 101)  # the user's manager
        invoice.note = "changed"
        invoice.save()
        self.assertEqual(Invoice.objects.get(pk=invoice.pk).number, 100)  # kept on update
        self.assertEqual(Invoice.objects.create(number=5000).number, 5000)
        self.assertEqual(list(Invoice.objects.unpaid().order_by("number")
                              .values_list("number", flat=True)), [100, 101, 5000])

    def test_not_in_forms(self) -> None:
        self.assertIsNone(Order._meta.pk.formfield())
        self.assertEqual(list(modelform_factory(Order, fields="__all__")().fields),
                         ["customer", "amount"])
        self.assertEqual(list(modelform_factory(Invoice, fields="__all__")().fields),
                         ["note", "paid"])
        editable = LeafpoolIdField(tag="order", editable=True)
        self.assertIsNotNone(editable.formfield())

    def test_full_clean_of_a_new_object(self) -> None:
        Order(customer="x").full_clean()
        Ticket(title="t").full_clean()


class BulkCreateTests(PoolTestCase):
    def test_a_thousand_objects_are_one_lpop(self) -> None:
        pools.fill("order", range(1, 1201))
        before = pools.lpop_calls()
        objs = Order.objects.bulk_create(Order(customer=f"c{i}") for i in range(1000))
        self.assertEqual(pools.lpop_calls() - before, 1)
        self.assertEqual([o.pk for o in objs], list(range(1, 1001)))
        self.assertEqual(list(Order.objects.order_by("pk").values_list("pk", flat=True)),
                         list(range(1, 1001)))
        self.assertEqual(pools.left("order"), 200)

    def test_objects_with_a_value_take_none(self) -> None:
        pools.fill("order", range(1, 11))
        before = pools.lpop_calls()
        objs = Order.objects.bulk_create(
            [Order(customer="a"), Order(id=500, customer="b"), Order(customer="c")])
        self.assertEqual(pools.lpop_calls() - before, 1)
        self.assertEqual([o.pk for o in objs], [1, 500, 2])
        Order.objects.bulk_create([Order(id=501, customer="d")])
        self.assertEqual(pools.lpop_calls() - before, 1)

    def test_abulk_create(self) -> None:
        pools.fill("order", range(1, 101))
        before = pools.lpop_calls()

        async def insert() -> list[Order]:
            return await Order.objects.abulk_create(
                [Order(customer=f"a{i}") for i in range(50)])

        objs = async_to_sync(insert)()
        self.assertEqual(pools.lpop_calls() - before, 1)
        self.assertEqual([o.pk for o in objs], list(range(1, 51)))

    def test_the_users_own_querysets_and_managers(self) -> None:
        pools.fill("ticket", range(1, 101))
        pools.fill("invoice", range(1, 101))
        before = pools.lpop_calls()
        Ticket.objects.bulk_create(Ticket(title=f"t{i}", closed=i % 2 == 0) for i in range(40))
        Invoice.objects.bulk_create(Invoice(note=f"n{i}") for i in range(30))
        self.assertEqual(pools.lpop_calls() - before, 2)
        self.assertEqual(Ticket.objects.open().count(), 20)  # the user's QuerySet method
        self.assertEqual(Invoice.objects.unpaid().count(), 30)
        self.assertEqual(Ticket.objects.filter(title="t0").get().pk, "1")
        for manager in (Order.objects, Ticket.objects, Invoice.objects, Parcel.objects):
            self.assertTrue(issubclass(manager._queryset_class, LeafpoolQuerySet))
        # a migration names the user's QuerySet (as_manager), not the class leafpool made
        self.assertEqual(Ticket.objects.deconstruct()[2], "shop.models.TicketQuerySet")
        self.assertEqual(Invoice.objects.deconstruct()[1], "shop.models.InvoiceManager")

    def test_two_fields_two_pops(self) -> None:
        pools.fill("order", range(1, 3))
        pools.fill("parcel", range(10, 40))
        pools.fill("tracking", range(BIG, BIG + 30))
        order = Order.objects.create(customer="p")
        before = pools.lpop_calls()
        parcels = Parcel.objects.bulk_create(Parcel(order=order) for _ in range(25))
        self.assertEqual(pools.lpop_calls() - before, 2)
        self.assertEqual([p.pk for p in parcels], list(range(10, 35)))
        self.assertEqual([p.tracking for p in parcels], [str(BIG + i) for i in range(25)])
        self.assertEqual(order.parcels.count(), 25)

    def test_fill_ids_takes_only_what_is_missing(self) -> None:
        pools.fill("order", range(1, 11))
        objs = [Order(customer="a"), Order(id=9000, customer="b")]
        fill_ids(Order, objs)
        self.assertEqual([o.pk for o in objs], [1, 9000])


class StringIdTests(PoolTestCase):
    def test_string_ids_round_trip(self) -> None:
        ids = [BIG + 1, BIG + 2, 2**63 - 1]
        pools.fill("ticket", ids)
        ticket = Ticket.objects.create(title="a")
        self.assertEqual(ticket.pk, str(BIG + 1))
        self.assertIsInstance(ticket.pk, str)
        read = Ticket.objects.get(pk=ticket.pk)
        self.assertEqual(read.pk, str(BIG + 1))
        self.assertIsInstance(read.pk, str)
        self.assertEqual(Ticket.objects.get(pk=BIG + 1), read)  # an int finds it too
        last = Ticket.objects.bulk_create([Ticket(title="b"), Ticket(title="c")])
        self.assertEqual([t.pk for t in last], [str(BIG + 2), str(2**63 - 1)])
        self.assertEqual(list(Ticket.objects.order_by("pk").values_list("pk", flat=True)),
                         [str(i) for i in ids])
        # JSON carries the exact value, as a string
        data = json.loads(serializers.serialize("json", Ticket.objects.filter(pk=ticket.pk)))
        self.assertEqual(data[0]["pk"], str(BIG + 1))
        read.full_clean()

    def test_bad_values_are_refused_naming_the_field(self) -> None:
        for bad in ("12x", "-1", "007", "", str(2**63), 1.5):
            with self.assertRaises(InvalidArgument) as caught:
                Ticket.objects.filter(pk=bad).exists()
            self.assertIn("shop.Ticket.id", str(caught.exception))
            self.assertIn(repr(bad), str(caught.exception))
        with self.assertRaises(ValidationError):
            Ticket._meta.pk.to_python("abc")
        self.assertEqual(Ticket._meta.pk.to_python(12), "12")


class EmptyPoolTests(PoolTestCase):
    def test_unknown_tag(self) -> None:
        order = Order(customer="nobody")
        # an error in save() marks the enclosing atomic block (the test's) for rollback,
        # whatever raised it: a savepoint keeps the test's transaction usable
        with self.assertRaises(UnknownTag), transaction.atomic():
            order.save()
        self.assertIsNone(order.pk)
        with self.assertRaises(UnknownTag):
            Order.objects.bulk_create([Order(customer="x")])
        self.assertEqual(Order.objects.count(), 0)

    def test_empty_pool_raises_and_inserts_nothing(self) -> None:
        pools.fill("order", [])
        order = Order(customer="late")
        with self.assertRaises(PoolEmpty), transaction.atomic():
            order.save()
        self.assertIsNone(order.pk)
        pools.fill("order", range(1, 4))
        objs = [Order(customer=f"c{i}") for i in range(10)]
        with self.assertRaises(PoolEmpty) as caught:
            Order.objects.bulk_create(objs)
        self.assertEqual(caught.exception.partial, [1, 2, 3])
        self.assertEqual([o.pk for o in objs], [None] * 10)
        self.assertEqual(Order.objects.count(), 0)
        pools.fill("order", range(4, 6))  # the 3 IDs the failed call got are a gap
        self.assertEqual(Order.objects.create(customer="now").pk, 4)


class ProcessTests(PoolTestCase):
    """Threads and forks, with IDs held ahead (ORM_PREFETCH) so that they matter."""

    def test_threads_get_distinct_increasing_ids(self) -> None:
        pools.fill("order", range(1, 3001))
        field = Order._meta.pk
        threads_n, rounds = 8, 60  # each round one ID, every tenth a batch of 5
        start = threading.Barrier(threads_n)
        got: dict[int, list[int]] = {}
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                start.wait(10)
                mine = []
                for i in range(rounds):
                    if i % 10 == 0:
                        objs = [Order(customer="t") for _ in range(5)]
                        fill_ids(Order, objs)
                        mine += [o.pk for o in objs]
                    else:
                        mine.append(field.get_pk_value_on_save(Order(customer="t")))
                got[n] = mine
            except BaseException as exc:  # reported below
                errors.append(exc)

        with override_settings(LEAFPOOL=leafpool_setting(ORM_PREFETCH=7)):
            threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_n)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            held = lp.configured_batches().held("order")
        self.assertEqual(errors, [])
        every = [i for ids in got.values() for i in ids]
        self.assertEqual(len(every), threads_n * (rounds + 4 * rounds // 10))
        self.assertEqual(len(set(every)), len(every))  # distinct
        for ids in got.values():
            self.assertEqual(ids, sorted(ids))  # increasing in each thread
            self.assertEqual(len(set(ids)), len(ids))
        self.assertLessEqual(held, 7)  # the bound
        self.assertEqual(sorted(every), list(range(1, len(every) + 1)))

    def test_a_forked_child_never_gets_the_parents_held_ids(self) -> None:
        pools.fill("order", range(1, 101))
        with override_settings(LEAFPOOL=leafpool_setting(ORM_PREFETCH=10)):
            self.assertEqual(Order.objects.create(customer="parent").pk, 1)
            self.assertEqual(lp.configured_batches().held("order"), 10)  # 2..11 held
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: takes IDs, touches no database
                try:
                    os.close(read)
                    field = Order._meta.pk
                    ids = [field.get_pk_value_on_save(Order()) for _ in range(3)]
                    os.write(write, json.dumps(ids).encode())
                    os._exit(0)
                except BaseException:
                    os._exit(1)
            os.close(write)
            with os.fdopen(read) as pipe:
                child = json.loads(pipe.read() or "null")
            _, status = os.waitpid(pid, 0)
            self.assertEqual(os.waitstatus_to_exitcode(status), 0)
            self.assertEqual(child, [12, 13, 14])  # its own pop, above what the parent held
            self.assertEqual(Order.objects.create(customer="parent").pk, 2)
        self.assertEqual(pools.left("order"), 100 - 11 - 11)


class SettingsTests(PoolTestCase):
    def test_the_django_setting_wins_over_the_environment(self) -> None:
        env = {"LEAFPOOL_EMPTY_POLICY": "wait", "LEAFPOOL_EMPTY_WAIT_SECONDS": "7"}
        with mock.patch.dict(os.environ, env):
            s = leafpool_settings({"EMPTY_POLICY": "raise", "ORM_PREFETCH": 3})
        self.assertEqual((s.empty_policy, s.empty_wait_seconds, s.orm_prefetch),
                         ("raise", 7.0, 3))
        with override_settings(LEAFPOOL=leafpool_setting(ORM_PREFETCH=4)):
            batches = lp.configured_batches()
            self.assertEqual(batches.prefetch, 4)
            self.assertEqual(batches.client.policy, "raise")
            self.assertIs(lp.configured_batches(), batches)
        self.assertIsNot(lp.configured_batches(), batches)  # rebuilt for the setting back

    def test_without_the_setting_the_environment(self) -> None:
        # the runner's environment says LEAFPOOL_REDIS_URL and LEAFPOOL_EMPTY_POLICY=raise
        with override_settings(LEAFPOOL=None):
            self.assertIs(lp.configured_batches(), default_batches())
            pools.fill("order", range(40, 42))
            self.assertEqual(Order.objects.create(customer="env").pk, 40)
            pools.fill("order", [])
            Order.objects.create(customer="env")
            with self.assertRaises(PoolEmpty), transaction.atomic():
                Order.objects.create(customer="env")

    def test_bad_values_name_the_key(self) -> None:
        cases = [
            ({"EMPTY_POLICY": "sometimes"}, "settings.LEAFPOOL['EMPTY_POLICY']"),
            ({"ORM_PREFETCH": -1}, "settings.LEAFPOOL['ORM_PREFETCH']"),
            ({"REDIS_URL": "http://x"}, "settings.LEAFPOOL['REDIS_URL']"),
            ({"redis_url": REDIS_URL}, "settings.LEAFPOOL['redis_url']"),
            ({"LEAFPOOL_REDIS_URL": REDIS_URL}, "settings.LEAFPOOL['LEAFPOOL_REDIS_URL']"),
            (["REDIS_URL"], "settings.LEAFPOOL"),
        ]
        for conf, field in cases:
            with self.assertRaises(ConfigurationError) as caught:
                leafpool_settings(conf)
            self.assertEqual(caught.exception.field, field)
        with override_settings(LEAFPOOL={"EMPTY_POLICY": "sometimes"}):
            with self.assertRaises(ConfigurationError) as caught, transaction.atomic():
                Order.objects.create(customer="x")
            self.assertIn("settings.LEAFPOOL['EMPTY_POLICY']", str(caught.exception))
            errors = [e for e in checks.run_checks() if e.id == "leafpool.E001"]
            self.assertEqual(len(errors), 1)
            self.assertIn("EMPTY_POLICY", errors[0].msg)
        self.assertEqual([e for e in checks.run_checks() if e.id == "leafpool.E001"], [])


class FieldTests(TestCase):
    def test_deconstruct(self) -> None:
        self.assertEqual(Order._meta.pk.deconstruct(), (
            "id", "leafpool.orm.django.LeafpoolIdField", [],
            {"primary_key": True, "serialize": False, "tag": "order"}))
        self.assertEqual(Ticket._meta.pk.deconstruct()[3]["as_string"], True)
        field = LeafpoolIdField(tag="x", editable=True, blank=False)
        kwargs = field.deconstruct()[3]
        self.assertEqual(kwargs, {"tag": "x", "editable": True, "blank": False})
        self.assertEqual(LeafpoolIdField(**kwargs).deconstruct()[3], kwargs)

    def test_no_migration_pending(self) -> None:
        # raises SystemExit when the models and the committed migrations differ
        call_command("makemigrations", "shop", check=True, dry_run=True, verbosity=0)

    def test_a_bad_tag_or_a_default_is_refused_when_the_model_is_defined(self) -> None:
        with self.assertRaises(InvalidTag):
            LeafpoolIdField(tag="no spaces", primary_key=True)
        with self.assertRaises(InvalidArgument):
            LeafpoolIdField(tag="order", default=1)
