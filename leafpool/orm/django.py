"""leafpool IDs as a Django model field (docs/design.md §1.3)::

    from leafpool.orm.django import LeafpoolIdField

    class Order(models.Model):
        id = LeafpoolIdField(tag="order", primary_key=True)
        number = LeafpoolIdField(tag="invoice", unique=True)   # an ordinary field too

The contract:

- **A BIGINT column** (``BigIntegerField``), filled from the tag's pool before the
  INSERT: ``obj.pk`` is known once ``save()`` returns, and ``save()`` of a new object is
  one INSERT (no UPDATE tried first). Creating an object (``Order()``) takes no ID; a
  value set by hand is kept. A field that is not the primary key is filled on insert
  when its value is None.
- **bulk_create takes one batch per field per call**: ``Order.objects.bulk_create(objs)``
  is one ``LPOP tag n`` for all objects without a value (``abulk_create`` too). The field
  adds :class:`LeafpoolQuerySet` to the model's managers (custom managers and querysets
  included); a manager declared later, or a queryset made otherwise, can use
  :class:`LeafpoolManager` or :class:`LeafpoolQuerySet`. A related manager
  (``customer.orders.bulk_create``) takes one ID per object.
- **The batching rules are** :class:`leafpool.orm.batch.IdBatches`': a process holds at
  most ``ORM_PREFETCH`` unused IDs per tag (default 0: none); a tag's IDs are increasing
  within a process; thread-safe; fork-safe; the empty-pool policy applies (``PoolEmpty``
  and nothing inserted, ``UnknownTag`` for a tag the pool does not know; never a
  sentinel ID).
- **Settings**: the ``LEAFPOOL_*`` environment variables, with the Django setting
  ``LEAFPOOL = {"REDIS_URL": ..., "EMPTY_POLICY": "raise", "ORM_PREFETCH": 0}`` over them
  (keys: the variables' names without the prefix). A bad value raises
  :class:`~leafpool.core.errors.ConfigurationError` naming the key
  (``settings.LEAFPOOL["EMPTY_POLICY"]``); ``manage.py check`` reports it (leafpool.E001).
- **as_string=True** keeps the column BIGINT and gives Python (and so JSON) decimal
  strings: JavaScript numbers are exact only up to 2**53.
- **Not in forms**: the field is ``editable=False`` and ``blank=True`` by default (the admin
  shows no input for it; ``editable=True`` gives one).
- **Migrations** write ``leafpool.orm.django.LeafpoolIdField(tag=...)``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ValidationError
from django.core.signals import setting_changed
from django.db import models
from django.db.models.signals import class_prepared

from leafpool.client import Client
from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import ConfigurationError, InvalidArgument
from leafpool.core.tags import validate_tag
from leafpool.orm.batch import IdBatches, batches_source, default_batches
from leafpool.orm.ids import id_value

__all__ = [
    "LeafpoolIdField",
    "LeafpoolManager",
    "LeafpoolQuerySet",
    "configured_batches",
    "fill_ids",
    "leafpool_settings",
]

log = logging.getLogger(__name__)

SETTING = "LEAFPOOL"

Batches = IdBatches | Callable[[], IdBatches]


# -- settings: settings.LEAFPOOL over the environment ----------------------------------------

def _key_name(key: object) -> str:
    return f"settings.{SETTING}[{key!r}]"


def leafpool_settings(conf: object) -> Settings:
    """The leafpool :class:`~leafpool.core.config.Settings` for the Django setting
    ``LEAFPOOL`` (``conf``): its keys over the ``LEAFPOOL_*`` environment variables. An
    unknown key or a bad value raises ConfigurationError naming the key."""
    if not isinstance(conf, Mapping):
        raise ConfigurationError(f"settings.{SETTING}", conf,
                                 'a dict of leafpool settings, e.g. {"REDIS_URL": ...}')
    overrides: dict[str, object] = {}
    for key, value in conf.items():
        name = key.lower() if isinstance(key, str) else ""
        if not isinstance(key, str) or key != key.upper() or name not in Settings.model_fields:
            raise ConfigurationError(
                _key_name(key), value, "a leafpool setting: the name of a LEAFPOOL_* variable "
                "without the prefix, upper case (REDIS_URL, EMPTY_POLICY, ORM_PREFETCH, ...)")
        overrides[name] = value
    try:
        return load_settings(**overrides)
    except ConfigurationError as exc:
        key = exc.field.removeprefix("LEAFPOOL_")
        if key in conf:  # the setting's value, not the environment's
            raise ConfigurationError(_key_name(key), exc.value, exc.allowed) from None
        raise


_configured: IdBatches | None = None
_configured_guard = threading.Lock()


def configured_batches() -> IdBatches:
    """Where the fields take IDs from, unless given ``batches=``: with the Django setting
    ``LEAFPOOL``, one :class:`IdBatches` built from it (at first use; again when the
    setting changes, as under ``override_settings``); without it, the process-wide
    :func:`~leafpool.orm.batch.default_batches` (the environment)."""
    global _configured
    conf = getattr(django_settings, SETTING, None)
    if conf is None:
        return default_batches()
    ready = _configured
    if ready is not None:
        return ready
    with _configured_guard:
        if _configured is None:
            s = leafpool_settings(conf)
            _configured = IdBatches(lambda: Client(settings=s), prefetch=s.orm_prefetch)
        return _configured


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    global _configured
    if setting != SETTING:
        return
    with _configured_guard:
        old, _configured = _configured, None
    if old is not None:
        log.info("settings.%s changed: IDs come from a new client (any the old one "
                 "held are a gap)", SETTING)
        old.close()


setting_changed.connect(_on_setting_changed, dispatch_uid="leafpool.orm.django.setting")


def _reset_in_child() -> None:
    global _configured_guard
    _configured_guard = threading.Lock()  # the batches forget their IDs themselves


os.register_at_fork(after_in_child=_reset_in_child)


def _check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check`` (and migrate, test, runserver): the settings the fields will
    use are valid (no connection is made)."""
    conf = getattr(django_settings, SETTING, None)
    try:
        if conf is None:
            load_settings()
        else:
            leafpool_settings(conf)
    except ConfigurationError as exc:
        return [checks.Error(str(exc), hint="leafpool's settings for LeafpoolIdField",
                             id="leafpool.E001")]
    return []


checks.register(_check_settings, checks.Tags.models)


# -- the field ------------------------------------------------------------------------------

class _TakenOnSave:
    """The field's ``default``: truthy, so that Django inserts a new object at once (no
    UPDATE tried first); :meth:`LeafpoolIdField.get_default` still gives None, so creating
    an object takes no ID. Never written to a migration."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<leafpool: taken on save>"


TAKEN_ON_SAVE = _TakenOnSave()


class LeafpoolIdField(models.BigIntegerField):  # type: ignore[misc]
    """A BIGINT filled from leafpool's pool of ``tag`` (see the module).

    ``batches`` replaces where IDs come from (an :class:`IdBatches`, or a callable
    returning one); it is not written to migrations."""

    description = "A 64-bit ID from leafpool's pool of a tag"

    def __init__(self, *args: Any, tag: str, as_string: bool = False,
                 batches: Batches | None = None, **kwargs: Any) -> None:
        self.tag = validate_tag(tag)
        self.as_string = bool(as_string)
        self._batches = batches_source(batches, configured_batches)
        for given in ("default", "db_default"):
            if given in kwargs:
                raise InvalidArgument(given, kwargs[given],
                                      f"not given: {tag}: the value is taken from the pool")
        kwargs["default"] = TAKEN_ON_SAVE
        kwargs.setdefault("editable", False)
        kwargs.setdefault("blank", True)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> tuple[str, str, list[Any], dict[str, Any]]:
        name, _, args, kwargs = super().deconstruct()
        kwargs.pop("default", None)
        # this field's own defaults (editable=False, blank=True) are left out
        for key, ours in (("editable", False), ("blank", True)):
            if getattr(self, key) == ours:
                kwargs.pop(key, None)
            else:
                kwargs[key] = getattr(self, key)
        kwargs["tag"] = self.tag
        if self.as_string:
            kwargs["as_string"] = True
        return name, "leafpool.orm.django.LeafpoolIdField", args, kwargs

    def _label(self) -> str:
        model = getattr(self, "model", None)
        return f"{model._meta.label}.{self.name}" if model is not None else (
            self.name or type(self).__name__)

    # -- values from the pool --------------------------------------------------------------

    def take(self, n: int = 1) -> list[int | str]:
        """``n`` IDs of the tag, increasing, in one pop (str with ``as_string``)."""
        ids = self._batches().take(self.tag, n)
        return [str(i) for i in ids] if self.as_string else list(ids)

    def get_default(self) -> None:
        return None  # an ID is taken on save, never when an object is created

    def get_pk_value_on_save(self, instance: models.Model) -> int | str:
        return self.take(1)[0]

    def pre_save(self, model_instance: models.Model, add: bool) -> Any:
        value = getattr(model_instance, self.attname)
        if add and value is None:
            value = self.take(1)[0]
            setattr(model_instance, self.attname, value)
        return value

    def formfield(self, **kwargs: Any) -> Any:
        if not self.editable:
            return None  # like AutoField: the value is not the user's to type
        return super().formfield(**kwargs)

    # -- as_string: str in Python, BIGINT in the database -------------------------------------

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None or not self.as_string:
            return value
        return str(value)

    def to_python(self, value: Any) -> Any:
        if not self.as_string or value is None:
            return super().to_python(value)
        try:
            return str(id_value(self._label(), value))
        except InvalidArgument as exc:
            raise ValidationError(str(exc), code="invalid", params={"value": value}) from None

    def get_prep_value(self, value: Any) -> Any:
        if not self.as_string:
            return super().get_prep_value(value)
        value = models.Field.get_prep_value(self, value)  # lazy objects resolved
        return None if value is None else id_value(self._label(), value)

    def run_validators(self, value: Any) -> None:
        if self.as_string and isinstance(value, str):
            value = int(value)  # the range validators compare numbers
        super().run_validators(value)


# -- bulk_create: one take per field per call ---------------------------------------------------

def fill_ids(model: type[models.Model], objs: Iterable[models.Model]) -> None:
    """Give every :class:`LeafpoolIdField` of ``model`` that is None on ``objs`` its ID:
    one take per field for all of them."""
    objs = list(objs)
    for field in model._meta.concrete_fields:
        if not isinstance(field, LeafpoolIdField):
            continue
        missing = [obj for obj in objs if getattr(obj, field.attname) is None]
        if not missing:
            continue
        ids = field.take(len(missing))
        log.debug("%s: %d IDs for %s in one take", field.tag, len(ids), field._label())
        for obj, value in zip(missing, ids, strict=True):
            setattr(obj, field.attname, value)


class LeafpoolQuerySet(models.QuerySet):  # type: ignore[misc]
    """A QuerySet whose ``bulk_create`` takes each :class:`LeafpoolIdField`'s IDs in one
    pop for all the objects (``abulk_create`` goes through it)."""

    def bulk_create(self, objs: Iterable[models.Model], *args: Any, **kwargs: Any) -> Any:
        objs = list(objs)
        fill_ids(self.model, objs)
        return super().bulk_create(objs, *args, **kwargs)


LeafpoolManager = models.Manager.from_queryset(LeafpoolQuerySet)


def _batching(manager: Any) -> None:
    """Make ``manager``'s querysets :class:`LeafpoolQuerySet` ones (for this instance and
    the copies Django makes of it for subclasses)."""
    qs = manager._queryset_class
    if issubclass(qs, LeafpoolQuerySet):
        return
    manager._queryset_class = type("Leafpool" + qs.__name__, (LeafpoolQuerySet, qs),
                                   {"__module__": __name__})
    if getattr(manager, "_built_with_as_manager", False):
        # a migration names the user's QuerySet, not the class made here
        path = f"{qs.__module__}.{qs.__name__}"
        manager.deconstruct = lambda: (True, None, path, None, None)


def _on_class_prepared(sender: Any, **kwargs: Any) -> None:
    if not any(isinstance(f, LeafpoolIdField) for f in sender._meta.concrete_fields):
        return
    for klass in sender.__mro__:
        meta = getattr(klass, "_meta", None)
        if meta is not None and isinstance(klass, models.base.ModelBase):
            for manager in meta.local_managers:
                _batching(manager)
    for manager in sender._meta.managers:  # the copies made before this signal
        _batching(manager)


class_prepared.connect(_on_class_prepared, weak=False, dispatch_uid="leafpool.orm.django")

