"""The API's URLs; the demo site mounts them at ``/api/memory/``."""

from django.urls import path, re_path

from persistent_memory.api import views

app_name = "persistent_memory_api"

urlpatterns = [
    path("enrich/", views.EnrichView.as_view(), name="enrich"),
    path("store/", views.StoreView.as_view(), name="store"),
    path("process/", views.ProcessView.as_view(), name="process"),
    path("health/", views.HealthView.as_view(), name="health"),
    path("sessions/", views.SessionListView.as_view(), name="sessions"),
    path("sessions/<str:session_id>/", views.SessionDetailView.as_view(), name="session"),
    path("sessions/<str:session_id>/memory/", views.SessionMemoryView.as_view(), name="memory"),
    path("sessions/<str:session_id>/memory/<str:key>/", views.KeyView.as_view(), name="key"),
    path(
        "sessions/<str:session_id>/memory/<str:key>/increment/",
        views.IncrementView.as_view(),
        name="increment",
    ),
    path("sessions/<str:session_id>/history/", views.HistoryView.as_view(), name="history"),
    path("sessions/<str:session_id>/summarize/", views.SummarizeView.as_view(), name="summarize"),
    re_path(r"^.*$", views.NotFoundView.as_view(), name="not-found"),
]
