from django.contrib import admin

from shop.models import Invoice, Order, Parcel, Ticket


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "customer", "amount")


@admin.register(Ticket)
class TicketAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "closed")


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("id", "number", "note", "paid")
    readonly_fields = ("number",)


admin.site.register(Parcel)
