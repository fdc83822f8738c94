from django.apps import AppConfig


class OrmBenchConfig(AppConfig):
    name = "bench.orm_django_app"
    label = "orm_bench"
    default_auto_field = "django.db.models.BigAutoField"
