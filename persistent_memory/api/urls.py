"""The API's URLs; the demo site mounts them at ``/api/memory/``."""

from django.urls import path, re_path

from persistent_memory.api import conversations, memories, owner, views

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
    path("sessions/<str:session_id>/messages/", conversations.MessagesView.as_view(), name="messages"),
    path("sessions/<str:session_id>/context/", conversations.ContextView.as_view(), name="context"),
    path(
        "sessions/<str:session_id>/conversations/",
        conversations.ConversationListView.as_view(),
        name="conversations",
    ),
    path("sessions/<str:session_id>/head/", conversations.HeadView.as_view(), name="head"),
    path("memories/", memories.MemoryListView.as_view(), name="memories"),
    path("memories/search/", memories.MemorySearchView.as_view(), name="memories-search"),
    path("memories/stats/", memories.MemoryStatsView.as_view(), name="memories-stats"),
    path("memories/<str:memory_id>/", memories.MemoryDetailView.as_view(), name="memory-detail"),
    path("memories/<str:memory_id>/similar/", memories.MemorySimilarView.as_view(), name="memory-similar"),
    path("owner/", owner.OwnerView.as_view(), name="owner"),
    re_path(r"^.*$", views.NotFoundView.as_view(), name="not-found"),
]
