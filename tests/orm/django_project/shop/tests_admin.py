"""The admin lists and edits models keyed by leafpool IDs (a superuser through the test
client): the changelist shows the rows, the add page takes an ID from the pool and has
no input for it, the change page edits another field and takes no ID."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import TestCase

from shop import pools
from shop.models import Invoice, Order, Ticket

BIG = 2**53


class AdminTests(TestCase):
    @classmethod
    def setUpTestData(cls) -> None:
        cls.admin = User.objects.create_superuser("admin", "admin@example.com", "pw")

    def setUp(self) -> None:
        pools.flush()
        self.client.force_login(self.admin)

    def test_changelist_lists_the_rows(self) -> None:
        pools.fill("order", range(BIG - 1, BIG + 4))
        Order.objects.bulk_create(Order(customer=f"customer-{i}") for i in range(3))
        page = self.client.get("/admin/shop/order/")
        self.assertEqual(page.status_code, 200)
        text = page.content.decode()
        for i, pk in enumerate(range(BIG - 1, BIG + 2)):
            self.assertIn(f"/admin/shop/order/{pk}/change/", text)
            self.assertIn(f"customer-{i}", text)
        self.assertIn("3 orders", text)

    def test_add_takes_an_id_and_shows_no_input_for_it(self) -> None:
        pools.fill("order", range(7, 10))
        form = self.client.get("/admin/shop/order/add/")
        self.assertEqual(form.status_code, 200)
        self.assertNotIn('name="id"', form.content.decode())
        self.assertIn('name="customer"', form.content.decode())
        done = self.client.post("/admin/shop/order/add/", {"customer": "added", "amount": "3"})
        self.assertEqual(done.status_code, 302, done.content.decode()[:2000])
        self.assertEqual(Order.objects.get().pk, 7)

    def test_change_edits_another_field(self) -> None:
        pools.fill("order", range(50, 52))
        order = Order.objects.create(customer="before", amount=1)
        page = self.client.get(f"/admin/shop/order/{order.pk}/change/")
        self.assertEqual(page.status_code, 200)
        before = pools.lpop_calls()
        done = self.client.post(f"/admin/shop/order/{order.pk}/change/",
                                {"customer": "after", "amount": "2"})
        self.assertEqual(done.status_code, 302, done.content.decode()[:2000])
        self.assertEqual(pools.lpop_calls(), before)
        self.assertEqual(list(Order.objects.values_list("pk", "customer", "amount")),
                         [(50, "after", 2)])

    def test_string_ids(self) -> None:
        pools.fill("ticket", [BIG + 1, 2**63 - 1])
        Ticket.objects.create(title="first")
        last = Ticket.objects.create(title="last")
        self.assertEqual(last.pk, str(2**63 - 1))
        page = self.client.get("/admin/shop/ticket/")
        self.assertEqual(page.status_code, 200)
        self.assertIn(f"/admin/shop/ticket/{BIG + 1}/change/", page.content.decode())
        self.assertIn(f"/admin/shop/ticket/{2**63 - 1}/change/", page.content.decode())
        url = f"/admin/shop/ticket/{last.pk}/change/"
        self.assertEqual(self.client.get(url).status_code, 200)
        done = self.client.post(url, {"title": "renamed"})
        self.assertEqual(done.status_code, 302, done.content.decode()[:2000])
        self.assertEqual(Ticket.objects.get(pk=last.pk).title, "renamed")
        # an ID that is no number is "not found", not an error
        self.assertEqual(self.client.get("/admin/shop/ticket/12x/change/").status_code, 302)

    def test_an_ordinary_field(self) -> None:
        pools.fill("invoice", range(1000, 1002))
        invoice = Invoice.objects.create(note="draft")
        page = self.client.get("/admin/shop/invoice/")
        self.assertIn("1000", page.content.decode())
        url = f"/admin/shop/invoice/{invoice.pk}/change/"
        page = self.client.get(url)
        self.assertEqual(page.status_code, 200)
        self.assertNotIn('name="number"', page.content.decode())  # shown, read only
        self.assertIn("1000", page.content.decode())
        done = self.client.post(url, {"note": "final", "paid": "on"})
        self.assertEqual(done.status_code, 302, done.content.decode()[:2000])
        self.assertEqual(list(Invoice.objects.values_list("number", "note", "paid")),
                         [(1000, "final", True)])
